#!/usr/bin/env bash
# Runs clang-tidy with the repository's .clang-tidy over every tracked .cc file
# (and, through HeaderFilterRegex, the headers they include) and fails on any
# warning. Needs the generated proto headers: run after `bazel build` /
# `bazel test` (tools/run_tests.sh does).
#
#   tools/ci/check_tidy.sh [--report FILE] [FILE.cc...]
#
# TIDY_JOBS (default: the number of cores) clang-tidy processes run at once.
# Results are cached per file (tools/ci/run_tidy.py): a file is checked again
# only when it, a header of ours it includes, its flags, .clang-tidy or
# clang-tidy changed, so a second run takes seconds.
set -uo pipefail
cd "$(dirname "$0")/../.."

report=()
if [ "${1:-}" = "--report" ]; then
  report=(--report "$2")
  shift 2
fi

if ! command -v clang-tidy >/dev/null; then
  echo "clang-tidy not installed (run tools/bootstrap.sh)"
  exit 1
fi
if [ ! -d bazel-bin/proto ]; then
  echo "clang-tidy: bazel-bin/proto is missing; running bazel build //proto/..."
  bazel build //proto/... || exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 tools/ci/compile_commands.py -o "$work/compile_commands.json" \
  >/dev/null || exit 1

/usr/bin/python3 tools/ci/run_tidy.py "$work" --jobs "${TIDY_JOBS:-$(nproc)}" \
  "${report[@]}" "$@"
