#!/usr/bin/env python3
"""tests/reliability_report.py on gtest reports written here: a sanitizer run whose cases passed
or skipped themselves is clean, one with a failed case is not, and the report says which; and
tests/failure_summary.py names the failed cases of the tests ctest recorded as failed."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def write_reports(directory, binary, results):
    """A gtest JSON report for `binary` with one case per entry of `results` (gtest's result and
    its failures, as GTEST_OUTPUT=json writes them)."""
    os.makedirs(directory, exist_ok=True)
    cases = []
    for i, (result, failures) in enumerate(results):
        case = {"name": "Case%d" % i, "status": "RUN", "result": result, "time": "0s"}
        if failures:
            case["failures"] = [{"failure": "expected 1, got 2", "type": ""}]
        cases.append(case)
    report = {"tests": len(cases), "testsuites": [{"name": "Suite", "testsuite": cases}]}
    with open(os.path.join(directory, binary + ".json"), "w", encoding="utf-8") as f:
        json.dump(report, f)


def run_report(root, tsan_results):
    write_reports(os.path.join(root, "plain"), "worker_pool_test", [("COMPLETED", False)])
    write_reports(os.path.join(root, "tsan"), "peer_handoff_test_host", tsan_results)
    os.makedirs(os.path.join(root, "fuzz"), exist_ok=True)
    out = os.path.join(root, "RELIABILITY.md")
    run = subprocess.run([sys.executable, os.path.join(HERE, "reliability_report.py"),
                    "--gtest", os.path.join(root, "plain"),
                    "--gtest-tsan", os.path.join(root, "tsan"),
                    "--fuzz-logs", os.path.join(root, "fuzz"), "--out", out],
                   capture_output=True, text=True, check=False)
    with open(out, encoding="utf-8") as f:
        return f.read(), run.stderr


def tsan_row(report):
    return next(line for line in report.splitlines() if line.startswith("| TSan |"))


class SanitizerRowTest(unittest.TestCase):
    def test_cases_that_skip_themselves_are_not_findings(self):
        with tempfile.TemporaryDirectory() as root:
            report, problems = run_report(root, [("COMPLETED", False), ("SKIPPED", False),
                                                 ("SKIPPED", False)])
        self.assertEqual(tsan_row(report),
                         "| TSan | 3 test cases in 1 binaries | no finding, all passed (2 skipped) |")
        self.assertNotIn("a sanitizer build failed", problems)

    def test_a_failed_case_is_a_finding(self):
        with tempfile.TemporaryDirectory() as root:
            report, problems = run_report(root, [("COMPLETED", True), ("SKIPPED", False)])
        self.assertEqual(tsan_row(report), "| TSan | 2 test cases in 1 binaries | **1 failed** |")
        self.assertIn("a sanitizer build failed", problems)


class FailureSummaryTest(unittest.TestCase):
    def summary(self, build_dir):
        return subprocess.run([sys.executable, os.path.join(HERE, "failure_summary.py"), build_dir],
                              capture_output=True, text=True, check=True).stdout

    def test_names_the_failed_cases_and_the_tests_without_a_report(self):
        with tempfile.TemporaryDirectory() as build:
            write_reports(os.path.join(build, "test-results"), "api_test_host",
                          [("COMPLETED", False), ("COMPLETED", True)])
            os.makedirs(os.path.join(build, "Testing", "Temporary"))
            with open(os.path.join(build, "Testing", "Temporary", "LastTestsFailed.log"), "w",
                      encoding="utf-8") as f:
                f.write("88:api_test_host\n91:node_host_tier_test_host\n")
            self.assertEqual(self.summary(build).splitlines(), [
                f"failed in {build}:",
                "  api_test_host: Suite.Case1",
                "      expected 1, got 2",
                "  node_host_tier_test_host: no gtest report (crashed, ended by a sanitizer or "
                "timed out)"])

    def test_a_run_that_failed_nothing_prints_nothing(self):
        with tempfile.TemporaryDirectory() as build:
            write_reports(os.path.join(build, "test-results"), "api_test_host",
                          [("COMPLETED", False)])
            self.assertEqual(self.summary(build), "")


if __name__ == "__main__":
    unittest.main()
