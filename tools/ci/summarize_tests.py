#!/usr/bin/env python3
"""Counts test cases from a Bazel build-event JSON file and the test.xml
files it names, and prints `N passed, N failed[, N skipped]`.

A test target that did not build, timed out or left no XML counts as one
failed case. Each check run outside Bazel (clang-format, layering,
clang-tidy) counts as one case: passed when named with --passed, failed when
named alone. Exit status: 0 when nothing failed, 1 otherwise.

usage: summarize_tests.py BEP_JSON [--passed CHECK_NAME]... [FAILED_CHECK_NAME...]
"""

import json
import sys
import urllib.parse
import xml.etree.ElementTree as ET


def xml_counts(path):
    """(passed, failed, skipped, failed_case_names) from one JUnit XML."""
    passed = failed = skipped = 0
    failed_names = []
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        name = "%s.%s" % (case.get("classname", ""), case.get("name", ""))
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            failed_names.append(name)
        elif (case.find("skipped") is not None or case.get("result") == "skipped"
              or case.get("status") == "notrun"):
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, failed_names


def main():
    bep_path = sys.argv[1]
    extra_passed = []
    extra_failed = []
    args = sys.argv[2:]
    while args:
        if args[0] == "--passed" and len(args) > 1:
            extra_passed.append(args[1])
            args = args[2:]
        else:
            extra_failed.append(args[0])
            args = args[1:]
    test_targets = set()
    summaries = {}
    xmls = {}
    with open(bep_path) as f:
        for line in f:
            event = json.loads(line)
            ident = event.get("id", {})
            if "targetConfigured" in ident:
                kind = event.get("configured", {}).get("targetKind", "")
                if kind.endswith("_test rule"):
                    test_targets.add(ident["targetConfigured"]["label"])
            elif "testSummary" in ident:
                label = ident["testSummary"]["label"]
                summaries[label] = event.get("testSummary", {}).get(
                    "overallStatus", "NO_STATUS")
            elif "testResult" in ident:
                label = ident["testResult"]["label"]
                for out in event.get("testResult", {}).get(
                        "testActionOutput", []):
                    if out.get("name") == "test.xml":
                        uri = out.get("uri", "")
                        if uri.startswith("file://"):
                            xmls.setdefault(label, []).append(
                                urllib.parse.unquote(uri[len("file://"):]))

    passed = failed = skipped = 0
    failures = []
    for label in sorted(test_targets):
        status = summaries.get(label, "NO_STATUS (did not build or run)")
        files = xmls.get(label, [])
        target_failed_cases = 0
        for path in files:
            try:
                p, fl, s, names = xml_counts(path)
            except (OSError, ET.ParseError):
                continue
            passed += p
            skipped += s
            target_failed_cases += fl
            failures += ["%s %s" % (label, n) for n in names]
        if status not in ("PASSED", "FLAKY") and target_failed_cases == 0:
            # The target failed without naming a failed case (crash,
            # timeout, build failure): count it as one failed case.
            target_failed_cases = 1
            failures.append("%s %s" % (label, status))
        failed += target_failed_cases

    passed += len(extra_passed)
    for name in extra_failed:
        failed += 1
        failures.append(name)

    if failures:
        print("failed:")
        for name in failures:
            print("  " + name)
    line = "%d passed, %d failed" % (passed, failed)
    if skipped:
        line += ", %d skipped" % skipped
    print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
