"""Judge checkov's JSON results against the accepted findings in hack/checkov-skips.yaml.

    python hack/checkov_report.py results.json hack/checkov-skips.yaml

Each skip names a check, the resources it accepts (checkov's ids, shell patterns allowed) and a
one-line reason. Exit 1 when a finding is not accepted, or a skip accepts nothing any more (a
fixed finding must leave the file too), or a skip is malformed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import yaml

CHECK_ID = re.compile(r"^CKV2?_K8S_\d+$")
MAX_REASON = 200


@dataclass(frozen=True)
class Finding:
    check: str
    resource: str
    name: str


@dataclass(frozen=True)
class Skip:
    check: str
    resources: tuple[str, ...]
    reason: str

    def accepts(self, finding: Finding) -> bool:
        return finding.check == self.check and any(
            fnmatchcase(finding.resource, pattern) for pattern in self.resources
        )


def load_skips(raw: Any) -> list[Skip]:
    """The skips file's entries, or ValueError naming the first bad one."""
    if not isinstance(raw, list):
        raise ValueError("the skips file must be a list of {check, resources, reason}")
    skips = []
    for index, entry in enumerate(raw):
        where = f"entry {index + 1}"
        if not isinstance(entry, dict) or set(entry) != {"check", "resources", "reason"}:
            raise ValueError(f"{where}: needs exactly check, resources and reason")
        check, resources, reason = entry["check"], entry["resources"], entry["reason"]
        if not isinstance(check, str) or not CHECK_ID.match(check):
            raise ValueError(f"{where}: check {check!r} is not a Kubernetes check id")
        if not resources or not all(isinstance(r, str) and r for r in resources):
            raise ValueError(f"{where} ({check}): resources must be a non-empty list of ids")
        if not isinstance(reason, str) or not reason.strip() or "\n" in reason.strip():
            raise ValueError(f"{where} ({check}): reason must be one line")
        if len(reason) > MAX_REASON:
            raise ValueError(f"{where} ({check}): reason longer than {MAX_REASON} characters")
        skips.append(Skip(check, tuple(resources), reason.strip()))
    return skips


def counts_and_failures(results: Any) -> tuple[int, list[Finding]]:
    """checkov's passed count and failed findings (its JSON is one report or a list of them)."""
    reports = results if isinstance(results, list) else [results]
    passed, failed = 0, []
    for report in reports:
        if report.get("check_type") != "kubernetes":
            continue
        passed += len(report["results"]["passed_checks"])
        failed += [
            Finding(c["check_id"], c["resource"], c["check_name"])
            for c in report["results"]["failed_checks"]
        ]
    return passed, failed


def triage(
    failed: list[Finding], skips: list[Skip]
) -> tuple[list[Finding], list[Finding], list[Skip]]:
    """(accepted, open, stale): findings a skip accepts, findings none does, skips unused."""
    accepted = [f for f in failed if any(s.accepts(f) for s in skips)]
    open_ = [f for f in failed if f not in accepted]
    stale = [s for s in skips if not any(s.accepts(f) for f in failed)]
    return accepted, open_, stale


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("skips", type=Path)
    parser.add_argument("--version", default="")
    args = parser.parse_args(argv)
    try:
        skips = load_skips(yaml.safe_load(args.skips.read_text()))
    except ValueError as exc:
        print(f"{args.skips}: {exc}", file=sys.stderr)
        return 1
    passed, failed = counts_and_failures(json.loads(args.results.read_text() or "{}"))
    accepted, open_, stale = triage(failed, skips)
    print(
        f"checkov {args.version}: {passed} passed, {len(failed)} failed "
        f"({len(accepted)} accepted in {args.skips.name}, {len(open_)} open)"
    )
    for finding in open_:
        print(f"  OPEN  {finding.check} {finding.resource}: {finding.name}")
    for skip in stale:
        print(f"  STALE {skip.check} {', '.join(skip.resources)}: accepts no finding, remove it")
    if passed == 0 and not failed:
        print("  checkov checked nothing: no Kubernetes manifests were scanned", file=sys.stderr)
        return 1
    return 1 if open_ or stale else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
