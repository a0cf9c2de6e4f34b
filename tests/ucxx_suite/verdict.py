"""The verdict on one progress mode's run of UCXX's suite (tests/ucxx_suite/run.sh).

    python verdict.py MODE RESULTS.xml NOT_PASSING.txt

RESULTS.xml is pytest's JUnit XML. NOT_PASSING.txt lists the tests that do not pass, one per
line: ``pattern | modes | reason``, the pattern an fnmatch pattern on ``file.py::test[params]``
(a collection error is ``file.py``), the modes ``*`` or a comma-separated list. Exits 1 when a
test fails that is not listed for this mode, or a listed one passes; prints the counts.
"""

import fnmatch
import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    """``{test id: "passed" | "skipped" | "failed"}`` from a JUnit XML file."""
    found = {}
    for case in ET.parse(path).iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        name = case.get("name", "")
        test = f"{module}.py::{name}" if name else f"{module}.py"
        if not name or not module:  # a collection error: classname is empty, name the module
            test = (name or module).replace("tests.", "") + ("" if test.endswith(".py") else ".py")
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            found[test] = "failed"
        elif "skipped" in kinds:
            found.setdefault(test, "skipped")
        else:
            found.setdefault(test, "passed")
    return found


def listed(path, mode):
    """``[(pattern, reason)]`` listed for `mode`."""
    entries = []
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pattern, modes, reason = (part.strip() for part in line.split("|", 2))
        if modes == "*" or mode in modes.split(","):
            entries.append((pattern, reason))
    return entries


def main(mode, results, not_passing):
    found = outcomes(results)
    entries = listed(not_passing, mode)

    def reason(test):
        return next((r for p, r in entries if fnmatch.fnmatchcase(test, p)), None)

    counts = {"passed": 0, "skipped": 0, "listed": 0}
    unexpected, now_passing = [], []
    for test, outcome in sorted(found.items()):
        why = reason(test)
        if outcome == "failed":
            if why is None:
                unexpected.append(test)
            else:
                counts["listed"] += 1
        elif outcome == "passed":
            counts["passed"] += 1
            if why is not None:
                now_passing.append(test)
        else:
            counts["skipped"] += 1
    total = len(found)
    print(
        f"ucxx suite: {mode}: {counts['passed']} of {total} passed, {counts['skipped']} skipped "
        f"(GPU tests without CuPy), {counts['listed']} listed as not passing, "
        f"{len(unexpected)} failed unlisted"
    )
    for test in unexpected:
        print(f"  FAILED (not listed): {test}")
    for test in now_passing:
        print(f"  PASSES (listed as not passing: take it off the list): {test}")
    return 1 if unexpected or now_passing else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
