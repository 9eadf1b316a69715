"""Two local clusters running side by side (make test's lanes) never get the same loopback pod
range: a range is held by a lock file for as long as the process that took it lives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from testkit.localcluster import loopback_pod_cidr

# Another process takes 190 of the 200 ranges and holds them until its stdin closes.
HOLD = ("from testkit.localcluster import loopback_pod_cidr as f; "
        "print(' '.join(f() for _ in range(190)), flush=True); input()")


def test_a_range_another_process_holds_is_never_handed_out() -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[3] / "testkit")
    try:
        assert holder.stdout is not None
        held = set(holder.stdout.readline().split())
        assert len(held) == 190 and all(r.startswith("127.") for r in held)
        # Five taken here (held until this process ends): from the 10 the other left, so not
        # one of its 190 (which, without the locks, five random picks would almost surely hit).
        mine = {loopback_pod_cidr() for _ in range(5)}
        assert len(mine) == 5 and not mine & held
    finally:
        holder.communicate("", timeout=10)
