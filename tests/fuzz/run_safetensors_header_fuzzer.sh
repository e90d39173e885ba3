#!/bin/bash
# Builds the safetensors header fuzzer with clang (libFuzzer + ASan + UBSan)
# straight from its sources and runs it for a bounded time over the seed
# corpus. Fails - never skips - when clang or its fuzzer runtime is missing.
set -euo pipefail

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

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
OUT="${TEST_TMPDIR}/safetensors_header_fuzzer"
mkdir -p "${OUT}/corpus"
ARTIFACTS="${TEST_UNDECLARED_OUTPUTS_DIR:-${OUT}}/"

SOURCES=(
  "${ROOT}/tests/fuzz/safetensors_header_fuzzer.cc"
  "${ROOT}/checkpoint/safetensors_header.cc"
  "${ROOT}/common/json.cc"
  "${ROOT}/checkpoint/dtype.cc"
)
MODULES="absl_status absl_statusor absl_strings absl_str_format_internal \
nlohmann_json"
# shellcheck disable=SC2046  # pkg-config output is a list of flags.
if ! "${CXX}" -std=c++20 -O1 -g -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -Wall -Wextra -Werror -I"${ROOT}" \
    $(pkg-config --cflags ${MODULES}) "${SOURCES[@]}" \
    $(pkg-config --libs ${MODULES}) -o "${OUT}/fuzzer"; then
  fail "${CXX} could not build the fuzzer (is libclang-rt-14-dev installed?)."
fi

# Bounds of the run; raise them for a deeper session, e.g.
#   bazel test //tests/fuzz:safetensors_header_fuzz_test \
#     --test_env=FUZZ_RUNS=-1 --test_env=FUZZ_SECONDS=600 --test_timeout=900
RUNS="${FUZZ_RUNS:-200000}"
SECONDS_LIMIT="${FUZZ_SECONDS:-30}"

echo "Built ${OUT}/fuzzer with $("${CXX}" --version | head -n 1)"
"${OUT}/fuzzer" \
  -runs="${RUNS}" -max_total_time="${SECONDS_LIMIT}" -timeout=10 \
  -rss_limit_mb=2048 \
  -max_len=4096 -print_final_stats=1 \
  -dict="${ROOT}/tests/fuzz/safetensors_header.dict" \
  -artifact_prefix="${ARTIFACTS}" \
  "${OUT}/corpus" "${ROOT}/tests/fuzz/corpus/safetensors_header"
