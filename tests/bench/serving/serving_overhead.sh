#!/usr/bin/env bash
# The serving path's cost next to the model (docs/BENCHMARKS.md, "Serving
# overhead"): one stream decoding at TP 1 through the local cluster
# (coordinator -> worker -> engram store) against the same decode steps run
# in one process (`mneme run`), on the same tiny model in the same run, and
# where the cluster's extra time goes (the daemons' own histograms), for
# three coordinator-worker step paths: one unary Step call per step, one
# long-lived StepStream, and the stream with overlap scheduling (the
# default).
# Usage: tests/bench/serving/serving_overhead.sh [NEW_TOKENS] [PAIRS] (after
#   bazel build //tools:mneme //services/...)
set -euo pipefail
cd "$(dirname "$0")/../../.."
new=${1:-64}
reps=${2:-7}
mneme=bazel-bin/tools/mneme
work=$(mktemp -d /tmp/mneme-overhead.XXXXXX)
trap 'kill -INT ${pid:-0} 2>/dev/null || true; wait 2>/dev/null; rm -rf "$work"' EXIT
"$mneme" make-checkpoint --model --out "$work/model" >/dev/null
prompt=$(seq -s, 40 55)

# In-process decode step: the median time between two new tokens of
# `mneme run` (its itl_ms_p50, measured as the serving bench measures a
# server's inter-token latency).
# Prints "ITL_MS ENGRAM_MS_PER_STEP".
inproc_ms() {
  "$mneme" run --checkpoint "$work/model" --tokens "$prompt" --threads 1 \
    --ignore-eos --max-new-tokens "$new" --json |
    /usr/bin/python3 -c 'import json,sys; j = json.load(sys.stdin); print(j["itl_ms_p50"], 1000 * j["engram_seconds"] / j["steps"])'
}
median() {
  /usr/bin/python3 -c "import sys, statistics; print('%.3f' % statistics.median(map(float, sys.argv[1:])))" "$@"
}

# Mean of a histogram (summed over its label sets), ms; and its count.
mean_ms() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys, urllib.request
addr, name = sys.argv[1], sys.argv[2]
s = c = 0.0
for line in urllib.request.urlopen('http://%s/metrics' % addr).read().decode().splitlines():
    if line.startswith(name + '_sum'): s += float(line.split()[-1])
    if line.startswith(name + '_count'): c += float(line.split()[-1])
print('%.3f %d' % (1000 * s / c if c else 0, c))
PY
}

# One cluster with the coordinator flags $2, labelled $1.
cluster() {
  local label=$1 flags=$2 dir="$work/c$3"
  "$mneme" cluster up --checkpoint "$work/model" --tp 1 --dcp 1 --all-metrics \
    --coordinator-flags "$flags" --workdir "$dir" >"$dir.out" 2>&1 &
  pid=$!
  for _ in $(seq 1 1200); do
    grep -q '^coordinator at ' "$dir.out" && break
    sleep 0.1
  done
  local addr coordinator worker store
  addr=$(sed -n 's/^coordinator at //p' "$dir.out")
  metrics_of() { sed -n "s/^$1 pid .*(metrics on \(.*\))$/\1/p" "$dir.out" | tail -n 1; }
  coordinator=$(metrics_of coordinator)
  worker=$(metrics_of "worker 0")
  store=$(metrics_of engram_store)
  # Pairs of one request through the cluster and the same decode in
  # process, back to back (the machine's speed drifts; a pair sees the same
  # machine): the medians of the cluster's ITL, the in-process one and
  # their difference.
  local itls=() inprocs=() diffs=() engrams=()
  for rep in $(seq 1 "$reps"); do
    "$mneme" bench serving --server "$addr" --streams 1 --requests 1 \
      --prompt-tokens 16 --max-new-tokens "$new" >"$dir.$rep.json"
    local i c
    i=$(/usr/bin/python3 -c "import json; print(json.load(open('$dir.$rep.json'))['itl_ms_p50'])")
    local e
    read -r c e <<<"$(inproc_ms)"
    itls+=("$i")
    inprocs+=("$c")
    engrams+=("$e")
    diffs+=("$(/usr/bin/python3 -c "print($i - $c)")")
  done
  local itl inproc overhead step_ms steps sched_ms worker_ms shm_ms shm_calls
  itl=$(median "${itls[@]}")
  inproc=$(median "${inprocs[@]}")
  overhead=$(median "${diffs[@]}")
  local inproc_engram worker_engram
  inproc_engram=$(median "${engrams[@]}")
  worker_engram=$(/usr/bin/python3 - "$worker" <<'PY'
import sys, urllib.request
s = n = 0.0
for line in urllib.request.urlopen('http://%s/metrics' % sys.argv[1]).read().decode().splitlines():
    if line.startswith('mneme_worker_engram_seconds_total'): s = float(line.split()[-1])
    if line.startswith('mneme_worker_steps_total{outcome="ok"}'): n = float(line.split()[-1])
print('%.3f' % (1000 * s / n if n else 0))
PY
)
  read -r step_ms steps <<<"$(mean_ms "$coordinator" 'mneme:step_seconds')"
  read -r sched_ms _ <<<"$(mean_ms "$coordinator" 'mneme:scheduler_seconds')"
  read -r worker_ms _ <<<"$(mean_ms "$worker" mneme_worker_step_seconds)"
  read -r shm_ms shm_calls <<<"$(mean_ms "$store" mneme_engram_shm_call_seconds)"
  kill -INT $pid
  wait $pid 2>/dev/null || true
  pid=0
  cat <<EOT
$label ($reps pairs, medians)
  in-process decode step (mneme run ITL p50)  $inproc ms
  cluster inter-token latency p50 (1 stream)  $itl ms
  serving-path overhead (pairwise difference) $overhead ms
  coordinator step on the workers (mean)      $step_ms ms over $steps steps
  coordinator planning (mean)                 $sched_ms ms
  worker step, Step handler (mean)            $worker_ms ms
  Engram wait per step: worker (mean)         $worker_engram ms
  Engram wait per step: in process (median)   $inproc_engram ms
  Engram lookups in the store, shm (mean)     $shm_ms ms x $shm_calls calls
EOT
}

cluster "unary Step calls" "--worker_step_stream=false --overlap_scheduling=false" 1
cluster "one StepStream, no overlap" "--overlap_scheduling=false" 2
cluster "one StepStream, overlap scheduling (default)" "" 3
