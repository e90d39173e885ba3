#!/usr/bin/env bash
# Runs the GPU tests and benchmarks of an unpacked bundle (tools/gpu/bundle.sh)
# and writes RESULTS_DIR/report.json, RESULTS_DIR/check.log and each
# binary's log and gtest JSON. Every binary runs through the bundle's own
# dynamic loader and libraries; the GPU driver is the machine's.
#
#   mneme-gpu/check.sh RESULTS_DIR
#
# Exits 0 when every test binary passed (tests may skip, with their reason
# in the log), 1 otherwise. Each binary has a time limit; the whole run
# stays within 8 minutes.
set -u

if [ $# -ne 1 ]; then
  echo "usage: check.sh RESULTS_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
results=$(realpath -m "$1")
mkdir -p "$results"
log="$results/check.log"
: > "$log"
loader="$here/lib/$(awk '/^loader / { print $2 }' "$here/BUILD_INFO")"

# The machine's NCCL (not in the bundle): the first of the CUDA toolkit's,
# the system's or the one PyTorch's wheels carry that loads with the
# bundle's C library (a system NCCL built for a newer glibc does not).
nccl_dirs=""
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/lib/x86_64-linux-gnu \
           $(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2/ { print $NF }' | xargs -r -n1 dirname) \
           $(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null); do
  [ -e "$dir/libnccl.so.2" ] || continue
  if "$loader" --library-path "$here/lib:$dir" "$here/bin/nccl_communicator_test" \
       --gtest_list_tests > /dev/null 2>&1; then
    nccl_dirs="$dir"
    break
  fi
  echo "nccl: $dir/libnccl.so.2 does not load with the bundle's libraries" >> "$log"
done
library_path="$here/lib${nccl_dirs:+:$nccl_dirs}"

run() {  # run SECONDS NAME ARGS... (stdout and stderr to RESULTS/NAME.log)
  local limit=$1 name=$2
  shift 2
  local tmp
  tmp=$(mktemp -d)
  TEST_TMPDIR="$tmp" timeout "$limit" "$loader" --library-path "$library_path" \
    "$here/bin/$name" "$@" > "$results/$name.log" 2>&1
  local rc=$?
  rm -rf "$tmp"
  return $rc
}

{
  echo "bundle: $(tr '\n' ' ' < "$here/BUILD_INFO")"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "nccl: ${nccl_dirs:-not found}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
} >> "$log"

tests=(device_info_test kernel_timer_test nccl_communicator_test memory_weights_test
       norms_rope_test attention_test hc_engram_test moe_test sampling_test
       codebook_weights_test backends_model_test)
entries=()
failed=0
start=$(date +%s)
# The test binaries run side by side (CHECK_JOBS at a time, all by default):
# each has its own CUDA context, and one H200 holds them all. The benchmark
# runs alone afterwards.
jobs=${CHECK_JOBS:-${#tests[@]}}
limit=${CHECK_TEST_SECONDS:-150}
running=0
for t in "${tests[@]}"; do
  (
    t0=$(date +%s)
    run "$limit" "$t" --gtest_output="json:$results/$t.json"
    echo "$? $(( $(date +%s) - t0 ))" > "$results/$t.rc"
  ) &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait
for t in "${tests[@]}"; do
  read -r rc secs < "$results/$t.rc" || { rc=125; secs=0; }
  rm -f "$results/$t.rc"
  passed=$(grep -c '^\[       OK \].*(' "$results/$t.log")
  skipped=$(grep -c '^\[  SKIPPED \].*(' "$results/$t.log")
  failures=$(grep -c '^\[  FAILED  \].*(' "$results/$t.log")
  echo "$t: rc=$rc passed=$passed skipped=$skipped failed=$failures ${secs}s" >> "$log"
  if [ "$rc" -ne 0 ]; then
    failed=$((failed + 1))
    grep -E '^\[  FAILED  \].*\(' "$results/$t.log" | head -n 20 >> "$log"
  fi
  entries+=("\"$t\": {\"rc\": $rc, \"passed\": $passed, \"skipped\": $skipped, \"failed\": $failures, \"seconds\": $secs}")
done

run 120 cuda_backend_bench --iters=50
bench_rc=$?
bench=$(tail -n 1 "$results/cuda_backend_bench.log")
case "$bench" in
  \{*\}) ;;
  *) bench="{\"error\": \"no JSON (rc $bench_rc)\"}" ;;
esac
echo "cuda_backend_bench: rc=$bench_rc $bench" >> "$log"

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
{
  echo "{"
  echo "  \"date\": \"$(date -u +%Y-%m-%d)\","
  echo "  \"gpu\": \"${gpu:-unknown}\","
  echo "  \"seconds\": $(( $(date +%s) - start )),"
  echo "  \"failed_binaries\": $failed,"
  echo "  \"tests\": {"
  for i in "${!entries[@]}"; do
    sep=","
    [ "$i" -eq $((${#entries[@]} - 1)) ] && sep=""
    echo "    ${entries[$i]}$sep"
  done
  echo "  },"
  echo "  \"bench\": $bench"
  echo "}"
} > "$results/report.json"
cat "$log"
[ "$failed" -eq 0 ]
