from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from autoglm_api.engine_args import MIDDLEWARE_IMPORT_PATH
from autoglm_api.keepalive import SERVER_KEEP_ALIVE_SECONDS
from autoglm_runtime import cli, launcher
from autoglm_runtime.config import ConfigError, RuntimeSettings
from testkit.processes import free_port


def settings(tmp_path: Path, **kwargs: object) -> RuntimeSettings:
    return RuntimeSettings(config_file=tmp_path / "none.json", labels_file=tmp_path / "none",
                           **kwargs)  # type: ignore[arg-type]


def test_passthrough_wins(tmp_path: Path) -> None:
    assert launcher.serve_argv(settings(tmp_path), ["m", "--port", "9"]) == ["m", "--port", "9"]


def test_built_from_config(tmp_path: Path) -> None:
    argv = launcher.serve_argv(settings(tmp_path, model="/models/phone"), [])
    assert argv[0] == "/models/phone"
    assert argv[argv.index("--middleware") + 1] == MIDDLEWARE_IMPORT_PATH
    assert argv[argv.index("--served-model-name") + 1] == "autoglm-phone-9b"


def test_no_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="AUTOGLM_MODEL"):
        launcher.serve_argv(settings(tmp_path), [])


@pytest.mark.parametrize("key_args", [
    ["--api-key", "s3cret"], ["--api-key=s3cret"], ["--api_key=s3cret"], ["--api-ke", "s3cret"],
    ["--api-k=s3cret"],  # vLLM's parser takes `_` for `-` and unique prefixes
    ["--api-key.x", "s3cret"],  # and `.key` (JSON form): api_key becomes ['{"x": "s3cret"}']
])
def test_an_api_key_on_the_command_line_is_refused(tmp_path: Path, key_args: list[str]) -> None:
    """The middleware checks the key before admission and knows only VLLM_API_KEY."""
    with pytest.raises(ConfigError, match="apiKeySecretRef") as err:
        launcher.serve_argv(settings(tmp_path), ["m", *key_args])
    assert "s3cret" not in str(err.value)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"engine": {"model": "/m", "extraArgs": key_args}}))
    with pytest.raises(ConfigError, match="VLLM_API_KEY"):
        launcher.serve_argv(RuntimeSettings(config_file=config, labels_file=tmp_path / "x"), [])


def _config_argv(tmp_path: Path, extra_args: list[str]) -> list[str]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"engine": {"model": "/m", "extraArgs": extra_args}}))
    return launcher.serve_argv(RuntimeSettings(config_file=config, labels_file=tmp_path / "x"), [])


# Spellings vLLM 0.32's parser reads as a managed flag (checked against the real parser by
# tests/vllm/test_vllm_managed_flags.py): `_` for `-`, unique abbreviations, aliases, `.key`.
@pytest.mark.parametrize("extra_args, flag, instead", [
    (["--max_model_len", "4096"], "--max-model-len", "engine.maxModelLen"),
    (["--dtyp", "float32"], "--dtype", "engine.dtype"),
    (["--tensor-parallel", "1"], "--tensor-parallel-size", "engine.tensorParallelSize"),
    (["-tp=1"], "--tensor-parallel-size", "engine.tensorParallelSize"),
    (["--disable-prefix-caching"], "--enable-prefix-caching", "engine.enablePrefixCaching"),
    (["--device-m", "0.5"], "--gpu-memory-utilization", "engine.gpuMemoryUtilizationPercent"),
    (["--served_model.x=y"], "--served-model-name", "engine.servedModelName"),
    (["--mi", "x.Y"], "--middleware", "it is always set"),
])
def test_extra_args_may_not_set_a_managed_flag(
    tmp_path: Path, extra_args: list[str], flag: str, instead: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _config_argv(tmp_path, extra_args)
    name = extra_args[0].split("=")[0].split(".")[0]
    assert f"engine.extraArgs: {name} sets {flag}, which the runtime manages" in str(err.value)
    assert instead in str(err.value)


def test_extra_args_may_not_read_a_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"engine\.extraArgs: may not use --config"):
        _config_argv(tmp_path, ["--config", "/etc/vllm.yaml"])


def test_extra_args_near_managed_flags_pass(tmp_path: Path) -> None:
    """Flags of their own that share a prefix with a managed one reach vLLM unchanged."""
    extra = ["--enforce-eager", "--seed=0", "--max-num-partial-prefills", "2",
             "--reasoning-parser-plugin", "/p.py", "--config-format", "hf", "--pooler-config", "{}"]
    assert _config_argv(tmp_path, extra)[-len(extra):] == extra


def test_flags_that_only_look_like_the_key_pass(tmp_path: Path) -> None:
    argv = ["m", "--api-server-count", "1", "--chat-template-kwargs", "{}"]
    assert launcher.serve_argv(settings(tmp_path), argv) == argv


@pytest.mark.parametrize("argv, value", [
    (["--host", "10.1.2.3"], "10.1.2.3"), (["--host=::"], "::"), (["--hostx", "y"], None),
    ([], None)])  # fmt: skip
def test_the_admin_api_listens_where_the_engine_does(argv: list[str], value: str | None) -> None:
    assert launcher.Launcher(["vllm", "serve", "m", *argv], RuntimeSettings()).admin_host == value


def test_missing_vllm_points_at_sim(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(launcher.shutil, "which", lambda _: None)
    monkeypatch.setattr(launcher.importlib.util, "find_spec", lambda _: None)
    assert cli.main(["serve", "--", "/models/x"]) == 127
    err = capsys.readouterr().err
    assert "vLLM is not installed" in err and "python -m testkit.sim" in err


def test_dry_run_prints_the_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AUTOGLM_MODEL", "/models/y")
    monkeypatch.setenv("AUTOGLM_CONFIG_FILE", str(tmp_path / "none.json"))
    assert cli.main(["serve", "--dry-run"]) == 0
    command = json.loads(capsys.readouterr().out)
    assert command[:3] == ["vllm", "serve", "/models/y"]


def test_config_error_exit_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "c.json"
    broken.write_text("{")
    monkeypatch.setenv("AUTOGLM_CONFIG_FILE", str(broken))
    monkeypatch.delenv("AUTOGLM_MODEL", raising=False)
    assert cli.main(["serve", "--dry-run"]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_launcher_returns_the_child_status(tmp_path: Path) -> None:
    settings = RuntimeSettings(admin_port=free_port())
    code = launcher.Launcher([sys.executable, "-c", "raise SystemExit(3)"], settings).run()
    assert code == 3


SOCKET = Path("/tmp/autoglm-admin-x/relay.sock")


def test_the_engine_gets_the_relay_socket_and_never_the_admin_token() -> None:
    pod = {"PATH": "/bin", "AUTOGLM_ADMIN_TOKEN": "s3cret",
           "AUTOGLM_ADMIN_TOKEN_FILE": "/etc/autoglm/admin/token", "AUTOGLM_ADMIN_PORT": "8001"}
    env = launcher.engine_env(pod, SOCKET)
    assert not {"AUTOGLM_ADMIN_TOKEN", "AUTOGLM_ADMIN_TOKEN_FILE"} & env.keys()
    assert "s3cret" not in env.values()
    assert env["AUTOGLM_ADMIN_SOCKET"] == str(SOCKET)
    assert env["PATH"] == "/bin"


def test_the_engine_keeps_idle_connections_longer_than_clients_reuse_them() -> None:
    env = launcher.engine_env({"PATH": "/bin"}, SOCKET)
    assert env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == str(SERVER_KEEP_ALIVE_SECONDS)


def test_a_keep_alive_the_pod_sets_itself_is_kept() -> None:
    env = launcher.engine_env({"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "120"}, SOCKET)
    assert env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "120"


@pytest.mark.parametrize("flag", [["--max-num-seqs", "96"], ["--max-num-seqs=96"]])
def test_the_middleware_learns_the_engine_sequence_limit_from_the_argv(
    flag: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in launcher.engine_env({}, SOCKET, ["vllm", "serve", "m", *flag]).items():
        monkeypatch.setenv(key, value)
    assert RuntimeSettings().engine_max_num_seqs == 96


def test_no_sequence_limit_in_the_argv_sets_none() -> None:
    env = launcher.engine_env({}, SOCKET, ["vllm", "serve"])
    assert launcher.ENGINE_MAX_NUM_SEQS_ENV not in env
