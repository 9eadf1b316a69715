"""What a benchmark leaves on its page under docs/benchmarks/: the command, the machine, the date
and the commit it ran on, then what it printed (its JSON and PNG go under testkit.paths.OUT_DIR)."""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from testkit.paths import BENCHMARK_PAGES, REPO


def commit() -> str:
    """The checked-out commit, with `-dirty` when the tree has uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              check=False).stdout.strip()  # fmt: skip
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{head}-dirty" if git("status", "--porcelain", "--untracked-files=no") else head


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"


def _markers(run: str) -> tuple[str, str]:
    which = f" ({run})" if run else ""
    return (f"<!-- latest run{which}: written by the benchmark; edit the page around it -->",
            f"<!-- end of the latest run{which} -->")


class _Tee(io.TextIOBase):
    def __init__(self, *streams: TextIO) -> None:
        self._streams = streams

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()


@contextlib.contextmanager
def results_page(
    name: str | None, *, run: str = "", pages: Path = BENCHMARK_PAGES
) -> Iterator[None]:
    """Print as usual, and put what the block printed on docs/benchmarks/<name>.md as the page's
    latest run (of `run`, for a benchmark with variants): the command, machine, date and commit,
    then the output verbatim. It replaces that run's earlier section or is added at the end; the
    rest of the page is left as written. Nothing is written when the block raises, or for no
    name (a partial run)."""
    if name is None:
        yield
        return
    begin, end = _markers(run)
    printed = io.StringIO()
    with contextlib.redirect_stdout(_Tee(sys.stdout, printed)):
        yield
    command = "python " + shlex.join([_relative(sys.argv[0]), *sys.argv[1:]])
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = "\n".join([
        begin,
        f"## Latest run ({run})" if run else "## Latest run",
        "",
        f"- command: `{command}`",
        f"- machine: {machine()}",
        f"- date: {when}",
        f"- commit: {commit()}",
        "",
        "```text",
        printed.getvalue().rstrip("\n"),
        "```",
        end,
    ])
    path = pages / f"{name}.md"
    page = path.read_text() if path.exists() else f"# {name}\n"
    if begin in page and end in page:
        head, rest = page.split(begin, 1)
        page = head + section + rest.split(end, 1)[1]
    else:
        page = page.rstrip("\n") + "\n\n" + section + "\n"
    pages.mkdir(parents=True, exist_ok=True)
    path.write_text(page)


def _relative(script: str) -> str:
    path = Path(script).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else script
