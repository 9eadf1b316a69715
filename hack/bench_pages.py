"""Is each benchmark page's code still the code its figures were measured on?

Every page under docs/benchmarks/ (README.md apart) carries a stamp before its first `##`
heading, an HTML comment naming the commit its figures were measured at and the code they
depend on (the benchmark script, the testkit modules it drives, the product code it measures;
files or folders, as they are named now):

    <!-- Measured at commit <40-hex sha>; code: bench/x.py, testkit/testkit/bench/y.py,
         router/autoglm_router -->

For each page this prints `current` (no listed path changed between the stamped commit and
HEAD) or `stale` (one did), with the files that changed. Renames are followed: git's rename
detection runs over the whole tree, so a file moved unchanged into or out of a listed path is
not a change, and a file moved and edited is. Content git does not see as a rename (a file
split in two, a move with most lines rewritten) counts as changed.

    python3 hack/bench_pages.py             # against HEAD
    python3 hack/bench_pages.py --worktree  # against the working tree (tracked files only)

Exit status 0 whatever is stale; 1 when a page has no stamp or a malformed one, names a commit
that is not in HEAD's history, names a path that does not exist, or is stamped before the
commit its own "Latest run" section ran on (a rerun whose stamp was not moved). Standard
library only, so the system Python runs it.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = REPO / "docs" / "benchmarks"

STAMP = re.compile(r"<!--\s*Measured at commit\s+(?P<sha>\S+?);\s*code:\s*(?P<code>.*?)\s*-->",
                   re.S)  # fmt: skip
SHA = re.compile(r"[0-9a-f]{40}")
# What testkit.report.results_page writes in a page's "Latest run" section.
RUN_COMMIT = re.compile(r"^- commit: ([0-9a-f]{7,40})(?:-dirty)?\s*$", re.M)


class StampError(ValueError):
    """A page whose stamp is missing or cannot be checked."""


@dataclass(frozen=True)
class Stamp:
    sha: str
    paths: tuple[str, ...]


@dataclass
class Report:
    page: str
    stamp: Stamp | None = None
    changed: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def status(self) -> str:
        if self.error:
            return "error"
        return "stale" if self.changed else "current"


def parse_stamp(text: str) -> Stamp:
    """The stamp of a page's text: before the first `##` heading, one only."""
    head = re.split(r"^## ", text, maxsplit=1, flags=re.M)[0]
    found = list(STAMP.finditer(head))
    if not found:
        raise StampError("no stamp (<!-- Measured at commit <sha>; code: <paths> -->) before "
                         "the first ## heading")
    if len(found) > 1:
        raise StampError("more than one stamp")
    sha, code = found[0]["sha"], found[0]["code"]
    if not SHA.fullmatch(sha):
        raise StampError(f"{sha!r} is not a full 40-hex commit sha")
    paths = tuple(p for p in re.split(r"[,\s]+", code) if p)
    if not paths:
        raise StampError("the stamp lists no code")
    for path in paths:
        if path.startswith("/") or ".." in Path(path).parts or path.endswith("/"):
            raise StampError(f"{path!r}: a path relative to the repository, without a "
                             "trailing slash")
    return Stamp(sha, paths)


def git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=False)  # fmt: skip


def in_history(repo: Path, sha: str, head: str = "HEAD") -> bool:
    return (git(repo, "cat-file", "-e", f"{sha}^{{commit}}").returncode == 0
            and git(repo, "merge-base", "--is-ancestor", sha, head).returncode == 0)


def _under(path: str, listed: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in listed)


def changed_paths(repo: Path, sha: str, paths: tuple[str, ...], against: str | None = "HEAD"
                  ) -> list[str]:  # fmt: skip
    """The files under `paths` that differ between `sha` and `against` (None: the working
    tree's tracked files). A rename git detects at 100% similarity is no change; any other
    entry touching a listed path, on either side of a rename, is."""
    args = ["diff", "-M", "--name-status", "-z", sha, *([against] if against else [])]
    result = git(repo, *args)
    if result.returncode != 0:
        raise StampError(f"git diff {sha}: {result.stderr.strip()}")
    fields = result.stdout.split("\0")
    changed: list[str] = []
    i = 0
    while i < len(fields) and fields[i]:
        status = fields[i]
        if status[0] in "RC":
            old, new = fields[i + 1], fields[i + 2]
            i += 3
            if status[0] == "R" and status[1:] == "100":
                continue
            touched = [new] if status[0] == "C" else [old, new]
            label = f"{old} -> {new}"
        else:
            touched = [fields[i + 1]]
            label = fields[i + 1]
            i += 2
        if any(_under(path, paths) for path in touched):
            changed.append(label)
    return changed


def latest_run_commits(text: str) -> list[str]:
    """The commits the page's "Latest run" sections say they ran on (their -dirty dropped)."""
    return RUN_COMMIT.findall(text)


def check_page(repo: Path, page: Path, against: str | None = "HEAD") -> Report:
    report = Report(str(page.relative_to(repo)))
    text = page.read_text()
    try:
        stamp = report.stamp = parse_stamp(text)
        head = against or "HEAD"
        if not in_history(repo, stamp.sha, head):
            raise StampError(f"{stamp.sha} is not a commit in {head}'s history")
        missing = [p for p in stamp.paths if not (repo / p).exists()]
        if missing:
            raise StampError(f"no such path: {', '.join(missing)}")
        for ran in latest_run_commits(text):
            if (git(repo, "cat-file", "-e", f"{ran}^{{commit}}").returncode == 0
                    and git(repo, "merge-base", "--is-ancestor", ran, stamp.sha).returncode):
                raise StampError(f"its latest run ran on {ran}, after the stamped commit "
                                 f"{stamp.sha[:7]}: move the stamp to the commit that "
                                 "recorded that run")
        report.changed = changed_paths(repo, stamp.sha, stamp.paths, against)
    except StampError as error:
        report.error = str(error)
    return report


def pages(repo: Path) -> list[Path]:
    return sorted(p for p in (repo / "docs" / "benchmarks").glob("*.md") if p.name != "README.md")


def main(argv: list[str] | None = None, repo: Path = REPO) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worktree", action="store_true",
                        help="compare with the working tree (tracked files), not HEAD")
    parser.add_argument("--files", type=int, default=5, metavar="N",
                        help="list at most N changed files per stale page (default 5)")
    args = parser.parse_args(argv)
    reports = [check_page(repo, page, None if args.worktree else "HEAD") for page in pages(repo)]
    width = max((len(r.page) for r in reports), default=0)
    for r in reports:
        sha = r.stamp.sha[:10] if r.stamp else "-"
        line = f"{r.page:<{width}}  {r.status:<7}  {sha:<10}"
        if r.error:
            line += f"  {r.error}"
        elif r.changed:
            shown = ", ".join(r.changed[: args.files])
            more = len(r.changed) - args.files
            line += f"  {len(r.changed)} changed: {shown}" + (f", {more} more" if more > 0 else "")
        print(line)
    stale = sum(r.status == "stale" for r in reports)
    errors = sum(r.status == "error" for r in reports)
    print(f"{len(reports)} pages: {len(reports) - stale - errors} current, {stale} stale, "
          f"{errors} without a valid stamp")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
