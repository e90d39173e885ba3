#!/usr/bin/env bash
# Installs what is missing, builds everything (CPU and, where nvcc exists,
# --config=cuda), runs every test and the style checks, and ends with one line
# `N passed, N failed` (each style check - clang-format, layering, clang-tidy -
# counts as one case). Exit status is non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."

tools/bootstrap.sh || exit 1

extra_failed=()
extra_passed=()
# check NAME COMMAND...: runs one style check, counted in the summary line.
check() {
  local name=$1
  shift
  if "$@"; then
    extra_passed+=(--passed "$name")
  else
    extra_failed+=("$name")
  fi
}
logdir=$(mktemp -d)
trap 'rm -rf "$logdir"' EXIT

echo "== clang-format check"
check check:clang-format tools/ci/check_format.sh

echo "== layering check"
check check:layering /usr/bin/python3 tools/ci/check_layering.py

echo "== bazel test //..."
bazel test //... --nocache_test_results \
  --build_event_json_file="$logdir/bep.json" "$@"
test_rc=$?
echo "bazel test exited $test_rc"

# clang-tidy reads the generated *.pb.h headers under bazel-bin, which the
# bazel test above has just built.
echo "== clang-tidy check"
check check:clang-tidy tools/ci/check_tidy.sh

if [ -n "$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)" ]; then
  echo "== bazel build --config=cuda //..."
  check check:build-config-cuda bazel build --config=cuda //...
  echo "== GPU bundle (tools/gpu/bundle.sh): builds, packs, under 60 MiB"
  check check:gpu-bundle tools/gpu/bundle.sh "$logdir/mneme-gpu.tar.xz"
else
  echo "== no CUDA toolkit here: skipping bazel build --config=cuda"
fi

/usr/bin/python3 tools/ci/summarize_tests.py "$logdir/bep.json" \
  "${extra_passed[@]}" "${extra_failed[@]}"
summary_rc=$?
if [ "$test_rc" -ne 0 ] && [ "$summary_rc" -eq 0 ]; then
  echo "bazel test failed (exit $test_rc) without a failed test case"
  echo "0 passed, 1 failed"
  exit 1
fi
exit $summary_rc
