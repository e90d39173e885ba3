#!/usr/bin/env bash
# The serving path's cost next to the model (docs/BENCHMARKS.md, "Serving
# overhead"): one stream decoding at TP 1 through the local cluster
# (coordinator -> worker -> engram store) against the same decode steps run
# in one process (`mneme run`), on the same tiny model in the same run, and
# where the cluster's extra time goes (the daemons' own histograms).
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
# load and the prefill cancel out.
run_s() {
  "$mneme" run --checkpoint "$work/model" --tokens "$prompt" --threads 1 \
    --ignore-eos --max-new-tokens "$1" --json |
    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])'
}
a=$(run_s 8)
b=$(run_s $((new + 8)))
inproc=$(/usr/bin/python3 -c "print('%.3f' % (1000 * ($b - $a) / $new))")

"$mneme" cluster up --checkpoint "$work/model" --tp 1 --dcp 1 --all-metrics \
  --workdir "$work/c" >"$work/up.out" 2>&1 &
pid=$!
for _ in $(seq 1 1200); do
  grep -q '^coordinator at ' "$work/up.out" && break
  sleep 0.1
done
addr=$(sed -n 's/^coordinator at //p' "$work/up.out")
metrics_of() { sed -n "s/^$1 pid .*(metrics on \(.*\))$/\1/p" "$work/up.out" | tail -n 1; }
coordinator=$(metrics_of coordinator)
worker=$(metrics_of "worker 0")
store=$(metrics_of engram_store)
"$mneme" bench serving --server "$addr" --streams 1 --requests 4 \
  --prompt-tokens 16 --max-new-tokens "$new" >"$work/bench.json"

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
itl=$(/usr/bin/python3 -c "import json; print('%.3f' % json.load(open('$work/bench.json'))['itl_ms_p50'])")
read -r step_ms steps <<<"$(mean_ms "$coordinator" 'mneme:step_seconds')"
read -r sched_ms _ <<<"$(mean_ms "$coordinator" 'mneme:scheduler_seconds')"
read -r worker_ms _ <<<"$(mean_ms "$worker" mneme_worker_step_seconds)"
read -r shm_ms shm_calls <<<"$(mean_ms "$store" mneme_engram_shm_call_seconds)"
read -r rpc_ms rpc_calls <<<"$(mean_ms "$store" mneme_engram_rpc_seconds)"
cat <<EOT
in-process decode step (mneme run, TP 1)    $inproc ms
cluster inter-token latency p50 (1 stream)  $itl ms
  coordinator step round trip (mean)        $step_ms ms over $steps steps
  coordinator planning (mean)               $sched_ms ms
  worker step, Step handler (mean)          $worker_ms ms
  Engram lookups in the store, shm (mean)   $shm_ms ms x $shm_calls calls
  Engram lookups in the store, gRPC (mean)  $rpc_ms ms x $rpc_calls calls
EOT
