"""Targets a run met or missed, printed as they are given; equal figures are printed as ties."""

from __future__ import annotations

import math
from typing import Any


def is_tie(value: float, other: float) -> bool:
    """Equal up to float rounding: printed as a tie, never as one beating the other."""
    return math.isclose(value, other, rel_tol=1e-9, abs_tol=1e-12)


def at_least(
    target: str, value: float, bar: float, detail: str, beats: bool = False, echo: bool = True
) -> dict[str, Any]:
    """value >= bar: PASS, FAIL or TIE; a tie meets an "at least" target, never a "beats"."""
    if is_tie(value, bar):
        result, met = "TIE", not beats
    else:
        result, met = ("PASS", True) if value > bar else ("FAIL", False)
    if echo:
        print(f"{result}: {target}: {detail}")
    return {"target": target, "verdict": result, "met": met, "detail": detail}


class Verdicts(list[dict[str, Any]]):
    """The targets' verdicts in the order given; `echo` prints each as it is recorded."""

    def __init__(self, echo: bool = True) -> None:
        super().__init__()
        self.echo = echo

    def add(self, target: str, value: float, bar: float, detail: str, beats: bool = False) -> None:
        """A figure against its bar (see `at_least`)."""
        self.append(at_least(target, value, bar, detail, beats, self.echo))

    def check(self, target: str, ok: bool, detail: str) -> None:
        """A yes-or-no target: PASS or FAIL."""
        self.append({"target": target, "pass": ok, "detail": detail})
        if self.echo:
            print(f"{'PASS' if ok else 'FAIL'}: {target}: {detail}")
