"""The resource reference in docs/ is generated from the same schema as the CRD, and kept equal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autoglm_operator import cli
from autoglm_operator.resource.crd import build_crd
from autoglm_operator.resource.reference import EMBEDDED_SCHEMAS, render_reference_markdown

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "reference" / "resource.md"


def _sections(text: str) -> dict[str, str]:
    parts = text.split("\n## ")
    return {part.split("\n", 1)[0]: part for part in parts[1:]}


def _fields(node: dict[str, Any], path: str) -> list[tuple[str, str]]:
    """(section, field) for every field of every object the reference unfolds."""
    found = []
    for key, child in node.get("properties", {}).items():
        found.append((path, key))
        child_path = f"{path}.{key}"
        if child_path in EMBEDDED_SCHEMAS:
            continue
        if child.get("properties"):
            found += _fields(child, child_path)
        elif child.get("items", {}).get("properties"):
            found += _fields(child["items"], child_path + "[]")
    return found


def test_committed_reference_is_generated_from_the_model() -> None:
    assert REFERENCE.read_text() == render_reference_markdown(), "run `make crd` and commit it"


def test_every_spec_and_status_field_has_a_row_in_its_section() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    sections = _sections(render_reference_markdown())
    fields = _fields(schema["properties"]["spec"], "spec")
    fields += _fields(schema["properties"]["status"], "status")
    assert len(fields) > 100
    for section, key in fields:
        assert f"\n| `{key}` |" in sections[section], f"{section}.{key} has no row"


def test_every_admission_rule_message_is_on_the_page() -> None:
    page = render_reference_markdown()
    crd_text = str(build_crd())
    assert "Refused at admission" in page
    for message in ("model.servedName is immutable", "modePolicy Adaptive needs",
                    "router.sessionAffinity.loadFactor must be from 1.0"):  # fmt: skip
        assert message in crd_text and message in page


def test_a_description_cannot_break_a_table_row_or_hide_as_a_tag() -> None:
    page = render_reference_markdown()
    router = _sections(page)["spec.router"]
    row = next(line for line in router.splitlines() if line.startswith("| `enabled` |"))
    assert row.count(" | ") == 3
    assert "&lt;name>-router" in row and "<name>" not in row


def test_crd_reference_prints_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["crd", "--reference"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == render_reference_markdown()
