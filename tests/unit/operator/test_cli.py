"""The console script: subcommands, scope flags, and the handler module list."""

from __future__ import annotations

import pytest

from autoglm_operator import cli
from autoglm_operator.handlers import settings
from autoglm_operator.resource.crd import render_crd_yaml


def test_crd_prints_the_generated_crd(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["crd"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == render_crd_yaml()


def test_run_needs_a_scope() -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run"])
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "-n", "a", "--all-namespaces"])
    args = cli.build_parser().parse_args(["run", "-n", "a", "-n", "b", "--no-leader-election"])
    assert args.namespace == ["a", "b"] and args.leader_election is False
    args = cli.build_parser().parse_args(["run", "-A", "--liveness", "http://0.0.0.0:8080/healthz"])
    assert args.all_namespaces and args.leader_election and args.liveness.endswith("/healthz")


def test_handler_modules_load_and_missing_optional_ones_are_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        settings,
        "HANDLER_MODULES",
        ("autoglm_operator.handlers.reconcile", "autoglm_operator.not_there"),
    )
    assert cli.load_handlers() == ["autoglm_operator.handlers.reconcile"]
