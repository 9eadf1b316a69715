"""Helpers for the loopback server tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from testkit.processes import SimProcess

ADMIN_TOKEN = "runtime-test-token"
MODEL = "autoglm-phone-9b"
StartSim = Callable[..., SimProcess]


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def log_of(sim: SimProcess) -> str:
    return Path(sim.log_path).read_text() if sim.log_path else ""
