#!/bin/bash
# Builds one fuzz target with clang (libFuzzer + ASan + UBSan) straight from
# its sources and runs it for a bounded time over its seed corpus
# (tests/fuzz/corpus/NAME) and dictionary (tests/fuzz/NAME.dict, if any).
# Fails - never skips - when clang or its fuzzer runtime is missing.
#
#   run_fuzzer.sh NAME "PKG-CONFIG MODULES" SOURCE.cc...
#
# SOURCE paths are relative to the workspace root and include the target's
# tests/fuzz/*_fuzzer.cc.
set -euo pipefail

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

[[ $# -ge 3 ]] || fail "usage: $0 NAME MODULES SOURCE.cc..."
NAME="$1"
MODULES="$2"
shift 2

CXX=""
for candidate in clang++-14 clang++; do
  if command -v "${candidate}" >/dev/null 2>&1; then
    CXX="$(command -v "${candidate}")"
    break
  fi
done
[[ -n "${CXX}" ]] || fail "clang++ not found; the fuzz target needs clang-14 \
and libclang-rt-14-dev (installed by tools/bootstrap.sh)."
command -v pkg-config >/dev/null 2>&1 || fail "pkg-config not found."

ROOT="${TEST_SRCDIR}/${TEST_WORKSPACE}"
OUT="${TEST_TMPDIR}/${NAME}_fuzzer"
mkdir -p "${OUT}/corpus"
ARTIFACTS="${TEST_UNDECLARED_OUTPUTS_DIR:-${OUT}}/"

SOURCES=()
for source in "$@"; do
  [[ -f "${ROOT}/${source}" ]] || fail "missing source ${source}"
  SOURCES+=("${ROOT}/${source}")
done
# shellcheck disable=SC2046,SC2086  # MODULES and pkg-config output are lists.
if ! "${CXX}" -std=c++20 -O1 -g -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -Wall -Wextra -Werror -I"${ROOT}" \
    $(pkg-config --cflags ${MODULES}) "${SOURCES[@]}" \
    $(pkg-config --libs ${MODULES}) -o "${OUT}/fuzzer"; then
  fail "${CXX} could not build the fuzzer (is libclang-rt-14-dev installed?)."
fi

# Bounds of the run; raise them for a deeper session, e.g.
#   bazel test //tests/fuzz:tokenizer_json_fuzz_test \
#     --test_env=FUZZ_RUNS=-1 --test_env=FUZZ_SECONDS=600 --test_timeout=900
RUNS="${FUZZ_RUNS:-100000}"
SECONDS_LIMIT="${FUZZ_SECONDS:-30}"
DICT=()
if [[ -f "${ROOT}/tests/fuzz/${NAME}.dict" ]]; then
  DICT=(-dict="${ROOT}/tests/fuzz/${NAME}.dict")
fi

echo "Built ${OUT}/fuzzer with $("${CXX}" --version | head -n 1)"
"${OUT}/fuzzer" \
  -runs="${RUNS}" -max_total_time="${SECONDS_LIMIT}" -timeout=10 \
  -rss_limit_mb=2048 \
  -max_len=4096 -print_final_stats=1 \
  "${DICT[@]}" \
  -artifact_prefix="${ARTIFACTS}" \
  "${OUT}/corpus" "${ROOT}/tests/fuzz/corpus/${NAME}"
