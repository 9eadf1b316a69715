"""hack/install-deps.sh stops only the service its own install started, never a user's process."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "hack" / "install-deps.sh"
# Commands the script may run; each fake appends its argv to calls.log.
RECORDED = ["apt-get", "invoke-rc.d", "update-rc.d", "systemctl", "pkill", "killall", "kill"]


def _fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def _run(tmp_path: Path, present: list[str]) -> list[str]:
    """Run the script on a PATH holding only fakes: `present` are the tools already installed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    log.touch()
    _fake(bin_dir, "id", "echo 0")  # root: no sudo
    _fake(bin_dir, "go", "exit 0")
    for name in RECORDED:
        _fake(bin_dir, name, f'echo "{name} $*" >> {log}')
    for name in present:
        _fake(bin_dir, name, "exit 0")
    # `kill` is a bash builtin, found before PATH: a function from BASH_ENV records it instead.
    bash_env = tmp_path / "bash_env"
    bash_env.write_text(f'kill() {{ echo "kill $*" >> {log}; }}\n')
    env = {"PATH": str(bin_dir), "BASH_ENV": str(bash_env)}
    probe = subprocess.run(["/bin/bash", "-c", "kill -0 $$"], env=env, timeout=30)
    assert probe.returncode == 0 and log.read_text().startswith("kill -0 "), "kill not recorded"
    log.write_text("")
    result = subprocess.run(
        ["/bin/bash", str(SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return log.read_text().splitlines()


def _signals(calls: list[str]) -> list[str]:
    return [c for c in calls if c.split()[0] in ("pkill", "killall", "kill")]


def test_a_prometheus_already_there_is_left_alone(tmp_path: Path) -> None:
    calls = _run(tmp_path, present=["prometheus"])  # openssl missing
    assert any(c.startswith("apt-get install") and c.endswith(" openssl") for c in calls), calls
    assert _signals(calls) == []
    assert not [c for c in calls if "prometheus" in c], calls


def test_the_service_this_run_installed_is_stopped_and_disabled(tmp_path: Path) -> None:
    calls = _run(tmp_path, present=["openssl"])
    assert any(c.startswith("apt-get install") and c.endswith(" prometheus") for c in calls)
    assert "invoke-rc.d prometheus stop" in calls
    assert "update-rc.d prometheus disable" in calls
    assert _signals(calls) == [], "a blanket kill reaches processes the script did not start"


def test_nothing_is_run_when_all_is_present(tmp_path: Path) -> None:
    assert _run(tmp_path, present=["prometheus", "openssl"]) == []
