"""Run make targets in lanes, then print each one's result and wall time and the run's 10 slowest
tests.

Each argument is a lane: make targets run one after another. Lanes run side by side, so a tier
that mostly waits on a control plane shares the machine with tiers that need little CPU. Every
target runs even when one before it failed, so one run shows every failure; the exit status is
non-zero when any failed. A target's output goes to out/test/<name>.log and is printed whole
when it ends, so lanes never interleave their lines; each pytest target also writes a JUnit
report, out/test/<name>.xml, whose per-test times (setup, call and teardown) the summary reads.
The summary ends with hack/bench_pages.py's report (which benchmark pages are stale), which never
changes the exit status.

    python3 hack/test-tiers.py "test-cluster test-e2e" "lint test-unit test-servers"
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "out" / "test"
SLOWEST = 10
_print_lock = threading.Lock()


def _say(text: str) -> None:
    with _print_lock:
        print(text, flush=True)


def name_of(target: str) -> str:
    return target.removeprefix("test-")


def run_target(target: str) -> tuple[int, float]:
    name = name_of(target)
    report, log = REPORTS / f"{name}.xml", REPORTS / f"{name}.log"
    report.unlink(missing_ok=True)
    addopts = f"{os.environ.get('PYTEST_ADDOPTS', '')} --junitxml={report}".strip()
    _say(f"==== {name}: started (make {target})")
    started = time.monotonic()
    with log.open("wb") as out:
        rc = subprocess.call(["make", "--no-print-directory", target], cwd=REPO,
                             stdout=out, stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTEST_ADDOPTS": addopts})
    wall = time.monotonic() - started
    result = "passed" if rc == 0 else f"FAILED (exit {rc})"
    _say(f"\n==== {name}: {result} in {wall:.0f} s\n{log.read_text(errors='replace')}"
         f"==== {name}: end of output\n")
    return rc, wall


def test_times(name: str) -> list[tuple[float, str]]:
    report = REPORTS / f"{name}.xml"
    if not report.exists():
        return []
    return [
        (float(case.get("time", 0)), f"{case.get('classname')}::{case.get('name')}")
        for case in ET.parse(report).iter("testcase")
    ]


def main(lanes: list[list[str]]) -> int:
    REPORTS.mkdir(parents=True, exist_ok=True)
    results: dict[str, tuple[int, float]] = {}

    def run_lane(targets: list[str]) -> None:
        for target in targets:
            results[target] = run_target(target)

    started = time.monotonic()
    threads = [threading.Thread(target=run_lane, args=(lane,)) for lane in lanes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started

    print("\n==== results (lanes ran side by side; a lane's targets one after another)")
    print(f"{'lane':<5} {'target':<12} {'result':<8} {'wall s':>8} {'tests':>6}")
    for index, lane in enumerate(lanes, 1):
        for target in lane:
            rc, wall = results[target]
            count = len(test_times(name_of(target)))
            print(f"{index:<5} {name_of(target):<12} {'passed' if rc == 0 else 'FAILED':<8} "
                  f"{wall:>8.0f} {count:>6}")
    print(f"{'':<5} {'all':<12} {'':<8} {elapsed:>8.0f}")
    slowest = sorted(
        ((seconds, name_of(target), test)
         for lane in lanes for target in lane for seconds, test in test_times(name_of(target))),
        reverse=True,
    )[:SLOWEST]
    print(f"\n==== the {SLOWEST} slowest tests (setup, call and teardown)")
    for seconds, name, test in slowest:
        print(f"{seconds:>8.1f} s  {name:<10} {test}")
    # Informational: a stale page never fails the run.
    print("\n==== benchmark pages (make bench-pages): stale if their code changed since",
          flush=True)
    subprocess.call([sys.executable, str(REPO / "hack" / "bench_pages.py")], cwd=REPO)
    failed = [name_of(t) for lane in lanes for t in lane if results[t][0] != 0]
    if failed:
        print(f"\nfailed: {' '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main([lane.split() for lane in sys.argv[1:]]))
