"""Each benchmark page names the commit its figures were measured at and the code they depend
on (hack/bench_pages.py), and the check tells a page whose code changed since from one whose
code did not."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from testkit.paths import BENCHMARK_PAGES, REPO, load_script

bench_pages = load_script("hack/bench_pages.py")

PAGES = sorted(p for p in BENCHMARK_PAGES.glob("*.md") if p.name != "README.md")


def test_there_are_pages_to_check() -> None:
    assert len(PAGES) >= 10
    assert bench_pages.pages(REPO) == PAGES


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_page_is_stamped_with_a_commit_in_history_and_paths_that_exist(page: Path) -> None:
    stamp = bench_pages.parse_stamp(page.read_text())
    assert bench_pages.in_history(REPO, stamp.sha), f"{stamp.sha}: not in HEAD's history"
    missing = [p for p in stamp.paths if not (REPO / p).exists()]
    assert not missing, f"no such path: {missing}"
    assert f"bench/{page.stem}.py" in stamp.paths, "the page's own benchmark is not listed"
    report = bench_pages.check_page(REPO, page)
    assert report.status in ("current", "stale"), report.error


# --- the check itself, on a repository of its own -------------------------------------------


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "test")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "test@example.invalid")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    git(tmp_path, "init", "-q")
    write(tmp_path, "bench/x.py", "print('x')\n")
    write(tmp_path, "lib/measured.py", "".join(f"line {i}\n" for i in range(40)))
    write(tmp_path, "lib/unrelated.py", "pass\n")
    write(tmp_path, "docs/benchmarks/README.md", "# Benchmarks\n")
    return tmp_path


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def write(repo: Path, relative: str, text: str) -> None:
    path = repo / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "--all")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def stamp_page(repo: Path, sha: str, code: str, extra: str = "") -> Path:
    page = repo / "docs" / "benchmarks" / "x.md"
    page.write_text(f"# x: a benchmark\n\n<!-- Measured at commit {sha}; code: {code} -->\n\n"
                    f"## Results\n\n| a | b |\n{extra}")  # fmt: skip
    return page


def status(repo: Path, page: Path) -> str:
    report = bench_pages.check_page(repo, page)
    return report.error or report.status


def test_a_page_is_current_until_its_code_changes(repo: Path) -> None:
    measured = commit(repo, "measured")
    page = stamp_page(repo, measured, "bench/x.py, lib/measured.py")
    assert status(repo, page) == "current"
    write(repo, "lib/unrelated.py", "pass  # edited\n")
    commit(repo, "other code")
    assert status(repo, page) == "current"
    write(repo, "lib/measured.py", "changed\n")
    commit(repo, "the measured code")
    assert status(repo, page) == "stale"
    assert bench_pages.check_page(repo, page).changed == ["lib/measured.py"]


def test_a_listed_folder_covers_every_file_under_it(repo: Path) -> None:
    page = stamp_page(repo, commit(repo, "measured"), "bench/x.py lib")
    write(repo, "lib/new.py", "x = 1\n")
    commit(repo, "a new file in the folder")
    assert bench_pages.check_page(repo, page).changed == ["lib/new.py"]


def test_a_file_moved_unchanged_is_current_and_moved_and_edited_is_stale(repo: Path) -> None:
    measured = commit(repo, "measured")
    (repo / "pkg").mkdir()
    git(repo, "mv", "lib/measured.py", "pkg/measured.py")
    commit(repo, "moved")
    page = stamp_page(repo, measured, "bench/x.py, pkg/measured.py")
    assert status(repo, page) == "current"
    text = (repo / "pkg" / "measured.py").read_text()
    write(repo, "pkg/measured.py", text.replace("line 3\n", "line three\n"))
    commit(repo, "edited after the move")
    report = bench_pages.check_page(repo, page)
    assert report.status == "stale"
    assert report.changed[0].startswith("lib/measured.py -> pkg/measured.py")


def test_the_working_tree_is_compared_only_when_asked(repo: Path) -> None:
    page = stamp_page(repo, commit(repo, "measured"), "bench/x.py, lib/measured.py")
    write(repo, "lib/measured.py", "uncommitted\n")
    assert bench_pages.check_page(repo, page).status == "current"
    assert bench_pages.check_page(repo, page, against=None).status == "stale"


@pytest.mark.parametrize(("text", "error"), [
    ("# x\n\nno stamp\n", "no stamp"),
    ("# x\n\n## Results\n\n<!-- Measured at commit {sha}; code: bench/x.py -->\n", "no stamp"),
    ("# x\n<!-- Measured at commit {short}; code: bench/x.py -->\n", "not a full 40-hex"),
    ("# x\n<!-- Measured at commit {sha}; code:  -->\n", "lists no code"),
    ("# x\n<!-- Measured at commit {sha}; code: ../x.py -->\n", "relative to the repository"),
    ("# x\n<!-- Measured at commit {sha}; code: bench/gone.py -->\n", "no such path"),
    ("# x\n<!-- Measured at commit {absent}; code: bench/x.py -->\n", "not a commit in"),
    ("# x\n<!-- Measured at commit {sha}; code: bench/x.py -->\n"
     "<!-- Measured at commit {sha}; code: bench/x.py -->\n", "more than one stamp"),
])  # fmt: skip
def test_a_stamp_that_cannot_be_checked_is_an_error(repo: Path, text: str, error: str) -> None:
    sha = commit(repo, "measured")
    page = repo / "docs" / "benchmarks" / "x.md"
    page.write_text(text.format(sha=sha, short=sha[:7], absent="0123456789" * 4))
    assert error in bench_pages.check_page(repo, page).error
    assert bench_pages.main([], repo=repo) == 1


def test_a_stamp_older_than_the_pages_latest_run_is_an_error(repo: Path) -> None:
    measured = commit(repo, "measured")
    write(repo, "lib/measured.py", "rerun on this\n")
    rerun = commit(repo, "rerun")
    run = f"\n<!-- latest run: ... -->\n## Latest run\n\n- commit: {rerun[:7]}-dirty\n"
    page = stamp_page(repo, measured, "bench/x.py, lib/measured.py", extra=run)
    assert "its latest run ran on" in bench_pages.check_page(repo, page).error
    page = stamp_page(repo, rerun, "bench/x.py, lib/measured.py", extra=run)
    assert bench_pages.check_page(repo, page).status == "current"


def test_stale_pages_exit_0_and_are_reported(repo: Path, capsys: pytest.CaptureFixture[str]
                                             ) -> None:  # fmt: skip
    stamp_page(repo, commit(repo, "measured"), "bench/x.py, lib/measured.py")
    write(repo, "bench/x.py", "print('y')\n")
    commit(repo, "the benchmark changed")
    assert bench_pages.main([], repo=repo) == 0
    out = capsys.readouterr().out
    assert "docs/benchmarks/x.md" in out and "stale" in out and "bench/x.py" in out
    assert "1 pages: 0 current, 1 stale, 0 without a valid stamp" in out
