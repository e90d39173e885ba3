"""A unittest runner for Bazel: runs the calling module's tests, writes
$XML_OUTPUT_FILE (JUnit) so that every case is counted, exits 0 or 1.

Use from a test module: `from junit_runner import main` ... `main()`.
"""

import os
import sys
import time
import unittest
import xml.etree.ElementTree as ET


class _Result(unittest.TextTestResult):

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cases = []
        self._start = 0.0

    def startTest(self, test):
        self._start = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome, detail="", name=None):
        self.cases.append((type(test).__name__,
                           name or test._testMethodName, outcome, detail,
                           time.monotonic() - self._start))

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failure", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            failed = issubclass(err[0], test.failureException)
            self._record(test, "failure" if failed else "error",
                         self._exc_info_to_string(err, test),
                         name="%s %s" % (test._testMethodName,
                                         subtest._subDescription()))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)


def main():
    """Runs the calling module's tests; writes JUnit XML; exits 0 or 1."""
    module = sys.modules["__main__"]
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2,
                                     resultclass=_Result)
    result = runner.run(suite)
    xml_path = os.environ.get("XML_OUTPUT_FILE")
    if xml_path:
        suite_el = ET.Element("testsuite", name=os.path.basename(
            module.__file__), tests=str(len(result.cases)))
        for classname, name, outcome, detail, seconds in result.cases:
            case = ET.SubElement(suite_el, "testcase", classname=classname,
                                 name=name,
                                 time="%.3f" % seconds)
            if outcome in ("failure", "error"):
                ET.SubElement(case, outcome, message=detail.splitlines()[-1]
                              if detail else "").text = detail
            elif outcome == "skipped":
                ET.SubElement(case, "skipped", message=detail)
        root_el = ET.Element("testsuites")
        root_el.append(suite_el)
        ET.ElementTree(root_el).write(xml_path, encoding="utf-8",
                                      xml_declaration=True)
    sys.exit(0 if result.wasSuccessful() else 1)
