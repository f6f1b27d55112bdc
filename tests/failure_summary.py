#!/usr/bin/env python3
"""Prints what failed in a test run, short enough to read at the end of a long log.

    tests/failure_summary.py BUILD_DIR...

For each build directory: the ctest tests that failed (Testing/Temporary/LastTestsFailed.log) and,
for each, the gtest cases that failed with the first lines of each failure message, read from the
JSON reports in BUILD_DIR/test-results (GTEST_OUTPUT=json:...). A test that left no report (it
crashed, a sanitizer ended it, or it timed out) is named with that said. Prints nothing for a
directory whose run failed nothing. Always exits 0: it reports, the run's own status decides.
Uses only the standard library.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_report import load_gtest  # noqa: E402  (the JSON reports, read one way)

MESSAGE_LINES = 6  # of each failure message
CASES_PER_TEST = 8


def failed_tests(build_dir):
    """The names ctest's last run in `build_dir` recorded as failed ("N:name" lines)."""
    path = os.path.join(build_dir, "Testing", "Temporary", "LastTestsFailed.log")
    try:
        with open(path, encoding="utf-8") as f:
            return [line.strip().split(":", 1)[-1] for line in f if line.strip()]
    except FileNotFoundError:
        return []


def failed_cases(cases):
    """[(case name, [failure message, ...])] of the cases that failed, from load_gtest's cases."""
    failed = []
    for case in cases:
        failures = [failure.get("failure", "") for failure in case.get("failures", [])]
        if failures:
            failed.append((f"{case['suite']}.{case.get('name')}", failures))
    return failed


def summarize(build_dir):
    lines = []
    reports = load_gtest(os.path.join(build_dir, "test-results"))
    for test in failed_tests(build_dir):
        if test not in reports:
            lines.append(f"  {test}: no gtest report (crashed, ended by a sanitizer or timed out)")
            continue
        cases = failed_cases(reports[test])
        if not cases:
            lines.append(f"  {test}: no failed case in its report (the process itself failed)")
        for name, failures in cases[:CASES_PER_TEST]:
            lines.append(f"  {test}: {name}")
            for failure in failures[:2]:
                for text in failure.splitlines()[:MESSAGE_LINES]:
                    lines.append(f"      {text}")
        if len(cases) > CASES_PER_TEST:
            lines.append(f"  {test}: and {len(cases) - CASES_PER_TEST} more failed case(s)")
    return lines


def main(argv):
    for build_dir in argv[1:]:
        lines = summarize(build_dir)
        if lines:
            print(f"failed in {build_dir}:")
            print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
