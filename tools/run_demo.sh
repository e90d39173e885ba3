#!/usr/bin/env bash
# The main job, on the built-in synthetic checkpoint: installs what is
# missing, builds the mneme CLI, makes a V4.1-layout checkpoint (FP8 and NVFP4
# Engram tables), inspects it and looks rows up by token ids.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/bootstrap.sh
bazel build //tools:mneme //services/engram:mneme_engram_store
mneme=bazel-bin/tools/mneme
work=${MNEME_DEMO_DIR:-$(mktemp -d /tmp/mneme-demo.XXXXXX)}
echo "== working in $work"

for format in fp8 nvfp4; do
  dir="$work/checkpoint-$format"
  rm -rf "$dir"
  echo "== mneme make-checkpoint --engram-format $format"
  "$mneme" make-checkpoint --out "$dir" --engram-format "$format" --seed 7
  echo "== mneme inspect"
  "$mneme" inspect "$dir"
done

dir="$work/checkpoint-nvfp4"
echo "== mneme engram describe (first lines)"
"$mneme" engram describe --checkpoint "$dir" >"$work/describe.json"
head -n 30 "$work/describe.json"
echo "== mneme engram ids: the 24 row ids of each position of a token sequence"
"$mneme" engram ids --checkpoint "$dir" --layer 1 --tokens 0,300,301,302,303
first_id=$("$mneme" engram ids --checkpoint "$dir" --layer 1 --tokens 300,301 |
  tail -n 1 | cut -d' ' -f1)
echo "== mneme engram rows: row $first_id decoded (first 8 of 256 values)"
"$mneme" engram rows --checkpoint "$dir" --layer 1 --ids "$first_id" |
  cut -d' ' -f1-8
echo "== mneme localize: the sparse local copy of rank 1 of 4 (strided split)"
"$mneme" localize --checkpoint "$dir" --out "$work/local-rank1" --tp 4 --rank 1
echo "== mneme bench engram: decode steps (48 tokens x 24 columns) from a token stream"
"$mneme" bench engram --checkpoint "$dir" --layer 1 --tokens-per-step 48 \
  --steps 100 --threads 4 --ram-cache-bytes 4194304
echo "== mneme_engram_store: the node's Engram store daemon on 127.0.0.1 (free port)"
bazel-bin/services/engram/mneme_engram_store --checkpoint "$dir" \
  --listen 127.0.0.1:0 --metrics_listen none >"$work/store.out" 2>"$work/store.err" &
store_pid=$!
trap 'kill $store_pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  grep -q '^listening on ' "$work/store.out" 2>/dev/null && break
  sleep 0.1
done
address=$(sed -n 's/^listening on //p' "$work/store.out")
echo "   listening on $address"
echo "== mneme engram lookup: rows of a token window over gRPC (first 6 values)"
"$mneme" engram lookup --server "$address" --layer 1 --tokens 300,301,302 \
  >"$work/lookup.out"
head -n 3 "$work/lookup.out" | cut -d' ' -f1-6
echo "   ($(wc -l <"$work/lookup.out") rows: 3 tokens x 24 columns)"
kill -TERM $store_pid
wait $store_pid && echo "   store drained and exited 0"
trap - EXIT
echo "== done: checkpoints in $work"
