from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autoglm_api.profiles import Mode
from autoglm_runtime.config import (
    ConfigError,
    RuntimeSettings,
    load_runtime_config,
    mode_from_labels,
    parse_labels,
    read_admin_token,
)


def settings(tmp_path: Path, config: object | None = None, labels: str | None = None,
             **kwargs: Any) -> RuntimeSettings:
    config_file = tmp_path / "config.json"
    if config is not None:
        config_file.write_text(config if isinstance(config, str) else json.dumps(config))
    labels_file = tmp_path / "labels"
    if labels is not None:
        labels_file.write_text(labels)
    return RuntimeSettings(config_file=config_file, labels_file=labels_file, **kwargs)


def test_defaults_without_files(tmp_path: Path) -> None:
    config = load_runtime_config(settings(tmp_path))
    assert config.served_model_name == "autoglm-phone-9b"
    assert config.max_model_len == 2048
    assert config.default_max_tokens == 512
    assert config.initial_mode is Mode.STREAMING
    assert config.engine is None


def test_config_file_is_camel_case(tmp_path: Path) -> None:
    config = load_runtime_config(settings(tmp_path, {
        "servedModelName": "phone", "maxModelLen": 4096, "defaultMaxTokens": 256,
        "initialMode": "batching", "somethingNewer": 1,
        "profiles": {"batching": {"maxConcurrency": 32, "maxQueue": 10,
                                  "queueTimeoutSeconds": 5}},
    }))
    assert (config.served_model_name, config.max_model_len) == ("phone", 4096)
    assert config.default_max_tokens == 256
    assert config.initial_mode is Mode.BATCHING
    assert config.profiles.batching.max_concurrency == 32
    assert config.profiles.batching.batch_window_millis == 0  # the profile's default stays


def test_label_file_wins_over_initial_mode(tmp_path: Path) -> None:
    labels = 'app="autoglm"\nautoglm.io/mode="batching"\npod-template-hash="abc"\n'
    config = load_runtime_config(settings(tmp_path, {"initialMode": "streaming"}, labels))
    assert config.initial_mode is Mode.BATCHING


def test_unknown_label_value_falls_back(tmp_path: Path) -> None:
    path = tmp_path / "labels"
    path.write_text('autoglm.io/mode="turbo"\n')
    assert mode_from_labels(path) is None
    assert mode_from_labels(tmp_path / "missing") is None


def test_parse_labels_unescapes() -> None:
    assert parse_labels('a="x\\"y"\nbroken line\nb=""') == {"a": 'x"y', "b": ""}


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    (json.dumps({"profiles": {"streaming": {"maxConcurrency": 0}}}), "invalid"),
    (json.dumps({"defaultMaxTokens": 4096}), "exceeds maxModelLen"),
])
def test_broken_config_is_an_error(tmp_path: Path, content: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_runtime_config(settings(tmp_path, content))


def test_engine_from_env_model(tmp_path: Path) -> None:
    config = load_runtime_config(settings(tmp_path, {"maxModelLen": 1024}, model="/models/x"))
    assert config.engine is not None
    assert config.engine.model == "/models/x"
    assert config.engine.max_model_len == 1024
    assert config.engine.max_num_seqs == 64  # the batching profile's cap: the envelope


def test_engine_from_file(tmp_path: Path) -> None:
    config = load_runtime_config(settings(tmp_path, {"engine": {
        "model": "/w", "servedModelName": "x", "maxModelLen": 1024}}))
    assert config.engine is not None
    assert (config.served_model_name, config.max_model_len) == ("x", 1024)


def test_admin_token_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert read_admin_token(settings(tmp_path)) is None
    monkeypatch.setenv("AUTOGLM_ADMIN_TOKEN", "from-env")
    assert read_admin_token(RuntimeSettings()) == "from-env"
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    assert read_admin_token(RuntimeSettings(admin_token_file=token_file)) == "from-file"
    token_file.write_text("rotated")
    assert read_admin_token(RuntimeSettings(admin_token_file=token_file)) == "rotated"
