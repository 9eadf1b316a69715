"""What Linux's /proc shows of a process tree: its descendants and their environments."""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def _parent(pid: int) -> int | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None  # gone
    return int(stat.rsplit(")", 1)[1].split()[1])  # the name in parentheses may hold spaces


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, children first."""
    parents = {p: parent for entry in PROC.iterdir() if entry.name.isdigit()
               if (parent := _parent(p := int(entry.name))) is not None}  # fmt: skip
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def environ(pid: int) -> dict[str, str]:
    """A process's environment as it was started with (what /proc/<pid>/environ shows)."""
    raw = (PROC / str(pid) / "environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0")
                if "=" in item)  # fmt: skip
