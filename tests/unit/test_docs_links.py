"""Every relative link in the READMEs and docs/ reaches a file, and a #fragment a heading in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [REPO / "README.md", REPO / "router" / "README.md", REPO / "runtime" / "README.md",
     *(REPO / "docs").rglob("*.md")]
)  # fmt: skip
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")


def anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def links(page: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", page.read_text()))
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def test_the_pages_have_links_to_check() -> None:
    assert sum(len(links(page)) for page in PAGES) > 50


def test_a_heading_anchor_is_what_github_makes_of_it() -> None:
    assert anchor("The router in front (spec.router)") == "the-router-in-front-specrouter"
    assert anchor("Rule 1c") == "rule-1c"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    for target in links(page):
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{target}: no such file"
        if fragment and resolved.suffix == ".md":
            assert fragment in anchors(resolved), f"{target}: no such heading"
