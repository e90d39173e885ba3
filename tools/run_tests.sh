#!/usr/bin/env bash
# Installs what is missing, builds everything (CPU and, where nvcc exists,
# --config=cuda), runs every test and the style checks, and ends with one line
# `N passed, N failed`. Exit status is non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."

tools/bootstrap.sh || exit 1

extra_failed=()
logdir=$(mktemp -d)
trap 'rm -rf "$logdir"' EXIT

echo "== clang-format check"
if ! tools/ci/check_format.sh; then
  extra_failed+=("check:clang-format")
fi

echo "== bazel test //..."
bazel test //... --nocache_test_results \
  --build_event_json_file="$logdir/bep.json" "$@"
test_rc=$?
echo "bazel test exited $test_rc"

if [ -n "$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)" ]; then
  echo "== bazel build --config=cuda //..."
  if ! bazel build --config=cuda //...; then
    extra_failed+=("check:build-config-cuda")
  fi
else
  echo "== no CUDA toolkit here: skipping bazel build --config=cuda"
fi

/usr/bin/python3 tools/ci/summarize_tests.py "$logdir/bep.json" "${extra_failed[@]}"
summary_rc=$?
if [ "$test_rc" -ne 0 ] && [ "$summary_rc" -eq 0 ]; then
  echo "bazel test failed (exit $test_rc) without a failed test case"
  echo "0 passed, 1 failed"
  exit 1
fi
exit $summary_rc
