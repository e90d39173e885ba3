#!/usr/bin/env bash
# Builds the CUDA tests and benchmarks (--config=cuda: sm_90 and sm_121) and
# packs them, with every shared library they load except the GPU driver's,
# the dynamic loader and check.sh, into one .tar.xz for a GPU machine that
# has no Bazel, no packages and no network:
#
#   tools/gpu/bundle.sh OUT.tar.xz
#   # there:  tar xf OUT.tar.xz && mneme-gpu/check.sh RESULTS_DIR
#
# Fails when the archive is not under 60 MiB.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: tools/gpu/bundle.sh OUT.tar.xz" >&2
  exit 2
fi
out=$(realpath -m "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

# label -> binary name in the bundle
targets=(
  //tests/gpu:device_info_test
  //tests/gpu/cuda:kernel_timer_test
  //tests/gpu/comm:nccl_communicator_test
  //tests/gpu/backend_conformance:attention_test
  //tests/gpu/backend_conformance:codebook_weights_test
  //tests/gpu/backend_conformance:hc_engram_test
  //tests/gpu/backend_conformance:memory_weights_test
  //tests/gpu/backend_conformance:moe_test
  //tests/gpu/backend_conformance:norms_rope_test
  //tests/gpu/backend_conformance:sampling_test
  //tests/model:backends_model_test
  //tests/bench/gpu:cuda_backend_bench
)
bazel build --config=cuda "${targets[@]}"
bin_dir=$(bazel info --config=cuda bazel-bin)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
bundle="$stage/mneme-gpu"
mkdir -p "$bundle/bin" "$bundle/lib"
for label in "${targets[@]}"; do
  path="${label#//}"
  path="${path/://}"
  cp "$bin_dir/$path" "$bundle/bin/"
done

# Every library the binaries load (ldd resolves the project's own shared
# objects through their RPATH), but not the driver's (libcuda, the NVIDIA
# libraries) nor NCCL (over 200 MiB for every architecture): those come
# from the GPU machine, where check.sh looks for them.
for label in "${targets[@]}"; do
  path="${label#//}"
  # In place, so that the RPATHs to the project's own objects resolve.
  ldd "$bin_dir/${path/://}" | awk '/=>/ { print $3 } !/=>/ && /^\s*\// { print $1 }'
done | sort -u | while read -r lib; do
  [ -n "$lib" ] && [ -e "$lib" ] || continue
  case "$(basename "$lib")" in
    libcuda.so* | libnvidia* | libnccl* | linux-vdso*) continue ;;
  esac
  cp -L "$lib" "$bundle/lib/"
done
loader=$(ldd "$bin_dir/tests/gpu/device_info_test" | awk '/ld-linux/ { print $1 }')
cp -L "$loader" "$bundle/lib/$(basename "$loader")"
chmod u+w "$bundle"/bin/* "$bundle"/lib/*

cp tools/gpu/check.sh "$bundle/check.sh"
chmod +x "$bundle/check.sh"
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "loader $(basename "$loader")"
} > "$bundle/BUILD_INFO"

tar -C "$stage" -cJf "$out" mneme-gpu
size=$(stat -c %s "$out")
limit=$((60 * 1024 * 1024))
echo "$out: $((size / 1024 / 1024)) MiB ($size bytes), $(ls "$bundle/bin" | wc -l) binaries, $(ls "$bundle/lib" | wc -l) libraries"
if [ "$size" -ge "$limit" ]; then
  echo "bundle is not under 60 MiB" >&2
  exit 1
fi
