"""What a benchmark leaves behind: its JSON under OUT_DIR, and a page under docs/benchmarks/
(the command, the machine, the date and the commit it ran on, then its table)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testkit.paths import BENCHMARK_PAGES, OUT_DIR, REPO


def out_path(name: str) -> Path:
    """OUT_DIR/<name>, its folder made."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    return OUT_DIR / name


def write_json(name: str, data: Any, *, indent: int | None = 2, **dumps: Any) -> Path:
    """data as OUT_DIR/<name>; the path, for the run's closing lines."""
    path = out_path(name)
    path.write_text(json.dumps(data, indent=indent, **dumps) + "\n")
    return path


def commit() -> str:
    """The checked-out commit, with `-dirty` when the tree has uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              check=False).stdout.strip()  # fmt: skip
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{head}-dirty" if git("status", "--porcelain", "--untracked-files=no") else head


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_page(
    name: str,
    title: str,
    header: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    notes: str = "",
    argv: Sequence[str] | None = None,
) -> Path:
    """docs/benchmarks/<name>.md: the command, machine, date and commit, then the table."""
    command = "python " + shlex.join([_relative(sys.argv[0]), *(argv or sys.argv[1:])])
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    page = [
        f"# {title}",
        "",
        f"- command: `{command}`",
        f"- machine: {machine()}",
        f"- date: {when}",
        f"- commit: {commit()}",
        "",
        markdown_table(header, rows),
        "",
    ]
    if notes:
        page += [notes.strip(), ""]
    BENCHMARK_PAGES.mkdir(parents=True, exist_ok=True)
    path = BENCHMARK_PAGES / f"{name}.md"
    path.write_text("\n".join(page))
    return path


def _relative(script: str) -> str:
    path = Path(script).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else script
