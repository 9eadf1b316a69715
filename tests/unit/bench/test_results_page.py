"""A benchmark's page holds what its last run printed, beside the prose written around it."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.report import results_page


def test_the_latest_run_replaces_the_last_one_and_keeps_the_page_around_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "demo.md"
    page.write_text("# demo\n\nWhat it measures.\n")
    with results_page("demo", pages=tmp_path):
        print("goodput 8.85 req/s: PASS")
    with results_page("demo", run="session ids sent", pages=tmp_path):
        print("hit ratio 0.66")
    with results_page("demo", pages=tmp_path):
        print("goodput 9.01 req/s: PASS")
    text = page.read_text()
    assert text.startswith("# demo\n\nWhat it measures.\n")
    assert "goodput 9.01 req/s: PASS" in text and "8.85" not in text
    assert "## Latest run (session ids sent)" in text and "hit ratio 0.66" in text
    assert text.count("## Latest run\n") == 1
    assert "- commit: " in text and "- command: `python " in text
    assert "goodput 9.01 req/s: PASS" in capsys.readouterr().out  # still printed


def test_a_run_that_fails_or_has_no_name_writes_no_page(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), results_page("broken", pages=tmp_path):
        print("half a table")
        raise RuntimeError("the run failed")
    with results_page(None, pages=tmp_path):
        print("a partial run")
    assert list(tmp_path.iterdir()) == []
