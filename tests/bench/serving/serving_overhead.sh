#!/usr/bin/env bash
# The serving path's cost next to the model (docs/BENCHMARKS.md, "Serving
# overhead"): one stream decoding at TP 1 through the local cluster
# (coordinator -> worker -> engram store) against the same decode steps run
# in one process (`mneme run`), on the same tiny model in the same run, and
# where the cluster's extra time goes (the daemons' own histograms), for
# three coordinator-worker step paths: one unary Step call per step, one
# long-lived StepStream, and the stream with overlap scheduling (the
# default).
# Usage: tests/bench/serving/serving_overhead.sh [NEW_TOKENS] (after
#   bazel build //tools:mneme //services/...)
set -euo pipefail
cd "$(dirname "$0")/../../.."
new=${1:-64}
mneme=bazel-bin/tools/mneme
work=$(mktemp -d /tmp/mneme-overhead.XXXXXX)
trap 'kill -INT ${pid:-0} 2>/dev/null || true; wait 2>/dev/null; rm -rf "$work"' EXIT
"$mneme" make-checkpoint --model --out "$work/model" >/dev/null
prompt=$(seq -s, 40 55)

# In-process decode step: (time of new+8 tokens - time of 8) / new, so the
# load and the prefill cancel out; the median of three such pairs, measured
# right before each cluster so that both see the same machine.
run_s() {
  "$mneme" run --checkpoint "$work/model" --tokens "$prompt" --threads 1 \
    --ignore-eos --max-new-tokens "$1" --json |
    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])'
}
inproc_ms() {
  local d=()
  for _ in 1 2 3; do
    local a b
    a=$(run_s 8)
    b=$(run_s $((new + 8)))
    d+=("$(/usr/bin/python3 -c "print(1000 * ($b - $a) / $new)")")
  done
  /usr/bin/python3 -c "import sys; v = sorted(map(float, sys.argv[1:])); print('%.3f' % v[1])" "${d[@]}"
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
  local inproc
  inproc=$(inproc_ms)
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
  "$mneme" bench serving --server "$addr" --streams 1 --requests 4 \
    --prompt-tokens 16 --max-new-tokens "$new" >"$dir.json"
  local itl step_ms steps sched_ms worker_ms shm_ms shm_calls
  itl=$(/usr/bin/python3 -c "import json; print('%.3f' % json.load(open('$dir.json'))['itl_ms_p50'])")
  read -r step_ms steps <<<"$(mean_ms "$coordinator" 'mneme:step_seconds')"
  read -r sched_ms _ <<<"$(mean_ms "$coordinator" 'mneme:scheduler_seconds')"
  read -r worker_ms _ <<<"$(mean_ms "$worker" mneme_worker_step_seconds)"
  read -r shm_ms shm_calls <<<"$(mean_ms "$store" mneme_engram_shm_call_seconds)"
  kill -INT $pid
  wait $pid 2>/dev/null || true
  pid=0
  cat <<EOT
$label
  in-process decode step (mneme run), median  $inproc ms
  cluster inter-token latency p50 (1 stream)  $itl ms
  serving-path overhead (ITL - in-process)    $(/usr/bin/python3 -c "print('%.3f' % ($itl - $inproc))") ms
  coordinator step, sent to applied (mean)    $step_ms ms over $steps steps
  coordinator planning (mean)                 $sched_ms ms
  worker step, Step handler (mean)            $worker_ms ms
  Engram lookups in the store, shm (mean)     $shm_ms ms x $shm_calls calls
EOT
}

cluster "unary Step calls" "--worker_step_stream=false --overlap_scheduling=false" 1
cluster "one StepStream, no overlap" "--overlap_scheduling=false" 2
cluster "one StepStream, overlap scheduling (default)" "" 3
