#!/usr/bin/env bash
# The main job, on the built-in synthetic checkpoint: installs what is
# missing, builds the mneme CLI, makes a V4.1-layout checkpoint (FP8 and NVFP4
# Engram tables), inspects it and looks rows up by token ids.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/bootstrap.sh
bazel build //tools:mneme
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
"$mneme" engram describe --checkpoint "$dir" | head -n 30
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
echo "== done: checkpoints in $work"
