"""hack/checkov_report.py, the judge of hack/checkov.sh: every checkov finding is fixed or
accepted in hack/checkov-skips.yaml with a one-line reason; a skip accepting nothing fails."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml

from testkit.paths import REPO, load_script

report = load_script("hack/checkov_report.py")

SKIPS_FILE = REPO / "hack" / "checkov-skips.yaml"


def _result(check: str, resource: str) -> dict[str, str]:
    return {"check_id": check, "resource": resource, "check_name": f"name of {check}"}


def _results(passed: int, failed: list[tuple[str, str]]) -> dict[str, object]:
    return {
        "check_type": "kubernetes",
        "results": {
            "passed_checks": [_result("CKV_K8S_1", f"Pod.ns.p{i}") for i in range(passed)],
            "failed_checks": [_result(c, r) for c, r in failed],
            "skipped_checks": [],
        },
    }


def _main(tmp_path: Path, results: object, skips: object) -> tuple[int, str]:
    (tmp_path / "results.json").write_text(json.dumps(results))
    (tmp_path / "skips.yaml").write_text(yaml.safe_dump(skips))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = report.main([str(tmp_path / "results.json"), str(tmp_path / "skips.yaml")])
    return rc, out.getvalue()


SKIP = {"check": "CKV_K8S_43", "resources": ["Deployment.*"], "reason": "tags, not digests"}


def test_the_projects_skips_file_is_well_formed() -> None:
    skips = report.load_skips(yaml.safe_load(SKIPS_FILE.read_text()))
    assert skips, "an empty skips file: then checkov.sh needs no file at all"
    assert len({(s.check, s.resources) for s in skips}) == len(skips)


def test_accepted_findings_pass_and_open_ones_fail(tmp_path: Path) -> None:
    results = _results(3, [("CKV_K8S_43", "Deployment.serving.phone-9b")])
    assert _main(tmp_path, results, [SKIP]) == (
        0,
        "checkov : 3 passed, 1 failed (1 accepted in skips.yaml, 0 open)\n",
    )
    results = _results(3, [("CKV_K8S_43", "Deployment.serving.phone-9b"),
                           ("CKV_K8S_22", "Deployment.serving.phone-9b")])  # fmt: skip
    rc, out = _main(tmp_path, results, [SKIP])
    assert rc == 1 and "OPEN  CKV_K8S_22 Deployment.serving.phone-9b" in out


def test_a_skip_that_accepts_nothing_fails(tmp_path: Path) -> None:
    rc, out = _main(tmp_path, _results(3, []), [SKIP])
    assert rc == 1 and "STALE CKV_K8S_43" in out


def test_nothing_scanned_fails(tmp_path: Path) -> None:
    assert _main(tmp_path, [], [SKIP])[0] == 1


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({**SKIP, "reason": ""}, "reason must be one line"),
        ({**SKIP, "reason": "first\nsecond"}, "reason must be one line"),
        ({**SKIP, "reason": "x" * 201}, "longer than 200"),
        ({**SKIP, "check": "CKV_AWS_1"}, "not a Kubernetes check id"),
        ({**SKIP, "resources": []}, "non-empty list"),
        ({"check": "CKV_K8S_43", "reason": "r"}, "exactly check, resources and reason"),
    ],
)
def test_malformed_skips_are_refused_with_the_entry_named(
    entry: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        report.load_skips([entry])
