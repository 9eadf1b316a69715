"""`make cluster-down` stops the processes `up` started and nothing that has since taken a PID."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit import localcluster


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(localcluster, "STATE_DIR", tmp_path)
    return tmp_path


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process in its own group, as a user's program holding a reused PID would be."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    # Popen returns once the child's exec has begun; /proc/<pid>/cmdline stays empty until the
    # kernel has set up the new program's arguments, a moment later.
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    deadline = time.monotonic() + 5
    while not cmdline.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


def _down_with(state_dir: Path, recorded: dict[str, object]) -> None:
    (state_dir / "pids.json").write_text(json.dumps(recorded))
    localcluster.main(["down"])


def test_identity_is_the_start_time_and_command_line(
    bystander: subprocess.Popen[bytes],
) -> None:
    identity = localcluster.process_identity(bystander.pid)
    assert identity is not None
    assert identity["pid"] == bystander.pid and identity["cmdline"] == ["sleep", "60"]
    assert isinstance(identity["startTime"], int) and identity["startTime"] > 0


def test_a_reused_pid_is_not_signalled(
    state_dir: Path, bystander: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    identity = localcluster.process_identity(bystander.pid)
    assert identity is not None
    # The state file names this PID, but the etcd `up` started there was an earlier process.
    earlier = {**identity, "startTime": identity["startTime"] - 1, "cmdline": ["etcd"]}
    _down_with(state_dir, {"etcd": earlier})
    assert bystander.poll() is None, "down signalled a process it did not start"
    assert f"not stopping pid {bystander.pid}" in capsys.readouterr().err


def test_a_pid_without_recorded_identity_is_not_signalled(
    state_dir: Path, bystander: subprocess.Popen[bytes]
) -> None:
    _down_with(state_dir, {"etcd": bystander.pid})  # the old state file: bare PIDs
    assert bystander.poll() is None


def test_the_process_up_started_is_stopped(
    state_dir: Path, bystander: subprocess.Popen[bytes]
) -> None:
    _down_with(state_dir, {"etcd": localcluster.process_identity(bystander.pid)})
    assert bystander.wait(timeout=5) == -15  # SIGTERM
    assert not state_dir.exists()
