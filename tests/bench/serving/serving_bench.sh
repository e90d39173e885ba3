#!/usr/bin/env bash
# The local cluster under load (docs/BENCHMARKS.md, "Serving"): throughput vs
# concurrency, time to first token vs prefill chunk size, and the
# coordinator's planning time per step vs the step time.
# Usage: tests/bench/serving/serving_bench.sh [TP] (after
#   bazel build //tools:mneme //services/...)
set -euo pipefail
cd "$(dirname "$0")/../../.."
tp=${1:-2}
mneme=bazel-bin/tools/mneme
work=$(mktemp -d /tmp/mneme-serving-bench.XXXXXX)
trap 'kill -INT ${pid:-0} 2>/dev/null || true; wait 2>/dev/null; rm -rf "$work"' EXIT
"$mneme" make-checkpoint --model --out "$work/model" >/dev/null

# Starts a cluster with the given chunk size; sets $addr and $metrics.
up() {
  "$mneme" cluster up --checkpoint "$work/model" --tp "$tp" --dcp "$tp" \
    --chunk-tokens "$1" --workdir "$work/c$1" >"$work/up$1.out" 2>&1 &
  pid=$!
  for _ in $(seq 1 1200); do
    grep -q '^coordinator at ' "$work/up$1.out" && break
    sleep 0.1
  done
  addr=$(sed -n 's/^coordinator at //p' "$work/up$1.out")
  metrics=$(sed -n 's/.*metrics on //p' "$work/c$1/coordinator.log" | head -n 1)
}
down() { kill -INT "$pid"; wait "$pid" || true; }
# Mean of a histogram from the coordinator's /metrics, in ms.
mean_ms() {
  /usr/bin/python3 -c "
import urllib.request
s = c = 0.0
for line in urllib.request.urlopen('http://$metrics/metrics').read().decode().splitlines():
    if line.startswith('$1_sum'): s = float(line.split()[-1])
    if line.startswith('$1_count'): c = float(line.split()[-1])
print('%.3f' % (1000 * s / c if c else 0))"
}

echo "## throughput vs concurrency (TP $tp, DCP $tp, 8192-token chunks; 64-token prompts, 16 new tokens)"
up 8192
echo "| streams | requests | output tok/s | total tok/s | TTFT p50 ms | ITL p50 ms | e2e p50 ms |"
echo "|---|---|---|---|---|---|---|"
for streams in 1 4 16 32; do
  requests=$((streams * 2 > 8 ? streams * 2 : 8))
  "$mneme" bench serving --server "$addr" --streams "$streams" \
    --requests "$requests" --prompt-tokens 64 --max-new-tokens 16 |
    /usr/bin/python3 -c "
import json, sys
j = json.load(sys.stdin)
print('| %d | %d | %.1f | %.1f | %.0f | %.0f | %.0f |' % (j['streams'], j['requests'],
  j['output_tokens_per_s'], j['total_tokens_per_s'], j['ttft_ms_p50'], j['itl_ms_p50'], j['e2e_ms_p50']))"
done
echo
echo "scheduler planning per step: $(mean_ms mneme:scheduler_seconds) ms; step on the workers: $(mean_ms mneme:step_seconds) ms (means over the runs above)"
down
echo
echo "## time to first token vs chunk size (one stream, 512-token prompts, 4 new tokens)"
echo "| chunk tokens | TTFT p50 ms | e2e p50 ms |"
echo "|---|---|---|"
for chunk in 64 128 256 512; do
  up "$chunk"
  "$mneme" bench serving --server "$addr" --streams 1 --requests 4 \
    --prompt-tokens 512 --max-new-tokens 4 | /usr/bin/python3 -c "
import json, sys
j = json.load(sys.stdin)
print('| $chunk | %.0f | %.0f |' % (j['ttft_ms_p50'], j['e2e_ms_p50']))"
  down
done
