"""`autoglm-router` refuses bad flags at start, with a message that names the flag."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from autoglm_api.profiles import Mode
from autoglm_router.cli import build_parser, create_app, main
from autoglm_router.kube import KubernetesDiscovery


@pytest.mark.parametrize(("argv", "message"), [
    ([], "--endpoint"),
    (["--endpoint", "10.0.0.7:8000"], "not a replica base URL"),
    (["--endpoint", "http://a:8000/v1"], "not a replica base URL"),
    (["--endpoint", "http://a:8000", "--load-factor", "0.9"], "--load-factor must be at least"),
    (["--endpoint", "http://a:8000", "--streaming-cap", "0"], "must be above 0"),
    (["--endpoint", "http://a:8000", "--streaming-chat-cap", "0"], "must be above 0"),
    (["--endpoint", "http://a:8000", "--batching-chat-cap", "-3"], "must be above 0"),
    (["--endpoint", "http://a:8000", "--other-overflow", "-1"], "--other-overflow must be at"),
    (["--endpoint", "http://a:8000", "--fresh-seconds", "0"], "--fresh-seconds must be above"),
    (["--endpoint", "http://a:8000", "--endpoint", "http://a:8000/"], "once"),
    # The gateway dials the address the picker names: a name would need resolving there.
    (["--endpoint", "http://sim-a:8000", "--ext-proc-port", "9002"], "by IP address"),
    (["--endpoint", "http://10.0.0.7:8000", "--ext-proc-port", "8000"],
     "--ext-proc-port must differ"),
    (["--endpoint", "http://10.0.0.7:8000", "--ext-proc-fallbacks", "1"],
     "only applies with --ext-proc-port"),
    (["--endpoint", "http://10.0.0.7:8000", "--ext-proc-port", "9002",
      "--ext-proc-fallbacks", "-1"], "--ext-proc-fallbacks must be at least 0"),
    (["--endpoint", "http://a:8000", "--hold-queue-size", "-1"], "must be at least 0"),
    (["--endpoint", "http://a:8000", "--hold-seconds", "0"], "must be above 0"),
    (["--endpoint", "http://a:8000", "--hold-queue-size", "8", "--hold-per-client", "9"],
     "--hold-per-client (9) must not exceed --hold-queue-size (8)"),
    (["--endpoint", "http://a:8000", "--hold-per-client", "0"], "must be above 0"),
    (["--endpoint", "http://a:8000", "--hold-heartbeat-seconds", "-1"], "must be at least 0"),
    (["--endpoint", "http://a:8000", "--hold-heartbeat-seconds", "nan"], "must be at least 0"),
    # The router writes nothing to the apiserver any more: the old report flags are gone.
    (["--endpoint", "http://a:8000", "--demand-object", "serving/autoglm"],
     "unrecognized arguments"),
])
def test_bad_flags_are_refused(argv: list[str], message: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_flags_reach_the_routing_config_and_proxy() -> None:
    args = build_parser().parse_args([
        "--endpoint", "http://a:8000/", "--load-factor", "2", "--no-spill", "--no-shed",
        "--other-overflow", "0.5", "--fresh-seconds", "0.25",
        "--streaming-cap", "4", "--max-body-bytes", "4096", "--prefix-chars", "64",
        "--hold-queue-size", "32", "--hold-seconds", "90", "--hold-per-client", "3",
        "--hold-heartbeat-seconds", "20", "--served-model-name", "a",
        "--served-model-name", "b"])
    app = create_app(args)
    assert (app.hold.size, app.hold.seconds, app.hold.per_client) == (32, 90.0, 3)
    assert app.settings.hold_heartbeat == 20.0
    assert app.settings.served_model_names == ("a", "b")
    default = create_app(build_parser().parse_args([
        "--endpoint", "http://a:8000", "--hold-queue-size", "32"]))
    assert default.hold.per_client == 8  # a quarter of the queue
    assert app.config.load_factor == 2.0 and not app.config.spill and not app.config.shed
    assert app.config.other_overflow == 0.5 and app.config.fresh_seconds == 0.25
    assert app.config.caps[Mode.STREAMING] == 4 and app.config.caps[Mode.BATCHING] == 64
    assert app.settings.max_body_bytes == 4096 and app.settings.prefix_chars == 64
    assert [e.name for e in app.discovery.endpoints()] == ["http://a:8000"]


KUBE = ["--kubernetes", "--selector", "app.kubernetes.io/instance=demo"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--endpoint", "http://a:8000", *KUBE], "--endpoint and --kubernetes exclude each other"),
    (["--kubernetes"], "--kubernetes needs --selector"),
    (["--kubernetes", "--selector", " "], "--kubernetes needs --selector"),
    (["--endpoint", "http://a:8000", "--selector", "x=y", "--target-port", "80"],
     "--selector, --target-port only apply with --kubernetes"),
    ([*KUBE, "--port-name", "http", "--target-port", "8000"],
     "--port-name and --target-port exclude each other"),
    ([*KUBE, "--target-port", "0"], "must be above 0"),
    ([*KUBE, "--kubeconfig", "/nonexistent/kubeconfig"], "cannot read kubeconfig"),
])
def test_bad_kubernetes_flags_are_refused(argv: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_kubernetes_outside_a_pod_without_a_kubeconfig_is_refused(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    with pytest.raises(SystemExit):
        main(KUBE)
    assert "give --kubeconfig" in capsys.readouterr().err


def self_signed_ca(folder: Path) -> Path:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(folder / "ca.key"), "-out", str(folder / "ca.crt"),
                    "-subj", "/CN=test-ca"], check=True, capture_output=True)
    return folder / "ca.crt"


def test_kubernetes_flags_reach_the_pod_watch(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    self_signed_ca(tmp_path)
    config.write_text(json.dumps({
        "current-context": "dev",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443",
                                               "certificate-authority": "ca.crt"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "dev", "context": {"cluster": "c", "user": "u",
                                                 "namespace": "team"}}],
    }))
    args = build_parser().parse_args([*KUBE, "--kubeconfig", str(config)])
    watch = create_app(args).discovery
    assert isinstance(watch, KubernetesDiscovery)
    assert (watch.namespace, watch.selector, watch.table.port) == (
        "team", "app.kubernetes.io/instance=demo", "http")
    args = build_parser().parse_args([*KUBE, "--kubeconfig", str(config), "--namespace", "ns",
                                      "--target-port", "8123"])
    watch = create_app(args).discovery
    assert isinstance(watch, KubernetesDiscovery)
    assert (watch.namespace, watch.table.port) == ("ns", 8123)


SECURITY_DOC = Path(__file__).resolve().parents[3] / "docs" / "operations" / "security.md"
UNITS = {"s": 1, "MiB": 1 << 20}


def test_the_security_pages_limit_table_gives_the_routers_own_defaults() -> None:
    """The table people read the defaults from (spec.router.limits points there)."""
    text = SECURITY_DOC.read_text().split("## Limits on every connection", 1)[1]
    rows = [line.split("|")[1:3] for line in text.splitlines() if line.startswith("| `--")]
    assert len(rows) >= 11
    parser = build_parser()
    for flag_cell, default_cell in rows:
        flag = flag_cell.strip().strip("`")
        number, _, unit = default_cell.strip().partition(" ")
        documented = float(number) * UNITS.get(unit, 1)
        dest = next(a.dest for a in parser._actions if flag in a.option_strings)
        assert parser.get_default(dest) == documented, flag
