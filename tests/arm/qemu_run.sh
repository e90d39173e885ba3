#!/usr/bin/env bash
# Runs aarch64 test binaries under qemu user-mode emulation (see qemu_test.bzl).
#
# usage: qemu_run.sh --cpu CPU --hwy-target NAME --vector-bytes N --probe PROBE
#                    [--expect-failure] -- TEST...
#
# First runs PROBE under `qemu-aarch64 -cpu CPU` and fails unless Highway's
# dispatch picks NAME with N-byte vectors there. Then runs each TEST (a gtest
# binary) the same way and merges their XML reports into $XML_OUTPUT_FILE.
# Exit status 0 when every test passed; with --expect-failure, 0 only when a
# test failed with failed test cases in its report (a crash, a binary that
# does not load or a missing report fails instead), and no report is written,
# so Bazel records the inverted verdict as one case.
set -uo pipefail

cpu="" target="" vector_bytes="" probe="" expect_failure=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) cpu=$2; shift 2 ;;
    --hwy-target) target=$2; shift 2 ;;
    --vector-bytes) vector_bytes=$2; shift 2 ;;
    --probe) probe=$2; shift 2 ;;
    --expect-failure) expect_failure=1; shift ;;
    --) shift; break ;;
    *) echo "qemu_run: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$cpu" ] || [ -z "$target" ] || [ -z "$vector_bytes" ] || [ -z "$probe" ] ||
   [ $# -eq 0 ]; then
  echo "qemu_run: need --cpu, --hwy-target, --vector-bytes, --probe and tests" >&2
  exit 2
fi

qemu=$(command -v qemu-aarch64 || true)
if [ -z "$qemu" ]; then
  echo "qemu_run: qemu-aarch64 not found (Debian's qemu-user; run tools/bootstrap.sh)" >&2
  exit 1
fi

probe_out=$("$qemu" -cpu "$cpu" "$probe") || {
  echo "qemu_run: the probe did not run under -cpu $cpu" >&2
  exit 1
}
echo "qemu_run: -cpu $cpu: $(echo "$probe_out" | tr '\n' ';')"
if [ "$(echo "$probe_out" | head -n1)" != "$target $vector_bytes" ]; then
  echo "qemu_run: expected dispatch to $target with $vector_bytes-byte vectors under" \
    "-cpu $cpu, got '$(echo "$probe_out" | head -n1)'" >&2
  exit 1
fi

report_dir="${TEST_TMPDIR:-$(mktemp -d)}/qemu_reports"
mkdir -p "$report_dir"
failed=()
results=()  # REPORT|EXIT_STATUS|TEST for the merge below
i=0
for test in "$@"; do
  i=$((i + 1))
  echo "== $test (-cpu $cpu)"
  rm -f "$report_dir/$i.xml"
  "$qemu" -cpu "$cpu" "$test" --gtest_output="xml:$report_dir/$i.xml"
  rc=$?
  [ "$rc" -eq 0 ] || failed+=("$test")
  results+=("$report_dir/$i.xml|$rc|$test")
done

if [ "$expect_failure" -eq 1 ]; then
  # Only failed test cases count: a binary that crashed, could not load or
  # wrote no report did not show the failure it is there to show.
  shown=()
  for result in "${results[@]}"; do
    IFS='|' read -r report rc test <<<"$result"
    if [ "$rc" -eq 1 ] && [ -f "$report" ] && grep -q "<failure" "$report"; then
      shown+=("$test")
    elif [ "$rc" -ne 0 ]; then
      echo "qemu_run: $test exited $rc without a failed test case" >&2
      exit 1
    fi
  done
  if [ ${#shown[@]} -eq 0 ]; then
    echo "qemu_run: expected a failure under -cpu $cpu ($target), but every test passed" >&2
    exit 1
  fi
  echo "qemu_run: failed under -cpu $cpu ($target) as expected: ${shown[*]}"
  exit 0
fi

if [ -n "${XML_OUTPUT_FILE:-}" ]; then
  /usr/bin/python3 - "$XML_OUTPUT_FILE" "${results[@]}" <<'PY' || exit 1
# Merges the binaries' gtest reports; a binary that exited non-zero without
# reporting a failed case (a crash, a missing report) adds one failed case.
import os
import sys
import xml.etree.ElementTree as ET

merged = ET.Element("testsuites")
for result in sys.argv[2:]:
    path, rc, test = result.split("|", 2)
    has_failure = False
    if os.path.exists(path):
        for suite in ET.parse(path).getroot().iter("testsuite"):
            has_failure |= suite.find(".//failure") is not None
            merged.append(suite)
    if rc != "0" and not has_failure:
        suite = ET.SubElement(merged, "testsuite", name="qemu_run", tests="1", failures="1")
        case = ET.SubElement(suite, "testcase", classname="qemu_run", name=os.path.basename(test))
        ET.SubElement(case, "failure", message="exit status %s without a report" % rc)
ET.ElementTree(merged).write(sys.argv[1], encoding="UTF-8", xml_declaration=True)
PY
fi

if [ ${#failed[@]} -ne 0 ]; then
  echo "qemu_run: failed under -cpu $cpu ($target): ${failed[*]}" >&2
  exit 1
fi
exit 0
