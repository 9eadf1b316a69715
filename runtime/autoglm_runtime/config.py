"""Runtime configuration: typed env settings plus the operator's ConfigMap file.

Two sources, one result. Env (prefix `AUTOGLM_`) says where things are and carries secrets;
the JSON file the operator mounts from its ConfigMap carries the mode profiles and the served
model. `load_runtime_config` merges them into a `RuntimeConfig` the middleware and the launcher
read; nothing here runs at import time.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, ConfigDict, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from autoglm_api.engine_args import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_SERVED_MODEL_NAME,
    EngineSettings,
)
from autoglm_api.profiles import ADMIN_PORT, MODE_LABEL, CamelModel, Mode, ModeProfiles

DEFAULT_CONFIG_FILE = Path("/etc/autoglm/config.json")
DEFAULT_LABELS_FILE = Path("/etc/podinfo/labels")


class ConfigError(ValueError):
    """The configuration cannot be used; the message says which file or variable and why."""


class RuntimeSettings(BaseSettings):
    """What the pod's environment tells the runtime (env prefix `AUTOGLM_`)."""

    model_config = SettingsConfigDict(env_prefix="AUTOGLM_", extra="ignore")

    config_file: Path = Field(
        default=DEFAULT_CONFIG_FILE,
        description="JSON from the operator's ConfigMap; optional: defaults apply when absent.",
    )
    labels_file: Path = Field(
        default=DEFAULT_LABELS_FILE,
        description="Downward-API file of the pod's labels; its mode label wins at start.",
    )
    admin_token: SecretStr | None = Field(
        default=None, description="Bearer token for the admin API; no default on purpose."
    )
    admin_token_file: Path | None = Field(
        default=None, description="File holding the admin token (a mounted Secret), re-read "
                                  "on every admin call."
    )
    admin_port: int = Field(
        default=ADMIN_PORT, ge=1, le=65535,
        description="The admin API's port, served by the launcher (or the sim), not the engine.",
    )
    admin_socket: Path | None = Field(
        default=None,
        description="Set by the launcher for its child only: the Unix socket the middleware "
                    "listens on for the admin calls the launcher relays.",
    )
    vllm_api_key: SecretStr | None = Field(
        default=None,
        # vLLM's own variable, unprefixed: the operator fills it from apiKeySecretRef and vLLM
        # reads the same one, so both check the same key.
        validation_alias=AliasChoices("VLLM_API_KEY", "vllm_api_key"),
        description="The key clients must send as `Authorization: Bearer <key>`; none: no check.",
    )
    engine_max_num_seqs: int | None = Field(
        default=None, ge=1,
        description="Set by the launcher for its child only: the engine's --max-num-seqs, "
                    "which bounds streams a profile puts first; none: the profiles' envelope.",
    )
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    drain_grace_seconds: float = Field(default=30.0, ge=0)
    # vLLM's own bound: no prompt can hold more characters than this times the context.
    max_chars_per_token: int = Field(default=32, ge=1)
    model: str | None = Field(
        default=None, description="Weights for `serve` when the config file names none."
    )
    gpu_metrics: bool = Field(default=True, description="Export NVML GPU memory when present.")


class ConfigFile(CamelModel):
    """The operator's ConfigMap payload (camelCase on the wire)."""

    # Unknown keys are the operator's business (a newer operator may add some).
    model_config = ConfigDict(extra="ignore")

    profiles: ModeProfiles = Field(default_factory=ModeProfiles)
    served_model_name: str | None = None
    max_model_len: int | None = Field(default=None, ge=128, le=131072)
    default_max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1)
    initial_mode: Mode = Mode.STREAMING
    engine: EngineSettings | None = None


@dataclass(frozen=True)
class RuntimeConfig:
    """The merged, validated configuration the runtime acts on."""

    profiles: ModeProfiles
    served_model_name: str
    max_model_len: int
    default_max_tokens: int
    initial_mode: Mode
    engine: EngineSettings | None
    max_body_bytes: int
    drain_grace_seconds: float
    max_chars_per_token: int
    gpu_metrics: bool


def read_config_file(path: Path) -> ConfigFile:
    """Parse the ConfigMap file; an absent file means defaults, a broken one is an error."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ConfigFile()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    try:
        data: Any = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid JSON: {exc}") from exc
    try:
        return ConfigFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"config file {path} is invalid:\n{exc}") from exc


# Downward API writes one `key="value"` per line with Go-style escapes in the value.
_LABEL_LINE = re.compile(r'^(?P<key>[^=]+)="(?P<value>(?:[^"\\]|\\.)*)"$')


def parse_labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for line in text.splitlines():
        match = _LABEL_LINE.match(line.strip())
        if match:
            labels[match["key"]] = re.sub(r"\\(.)", r"\1", match["value"])
    return labels


def mode_from_labels(path: Path) -> Mode | None:
    """The mode the pod's label records, so a restarted container resumes its mode."""
    try:
        labels = parse_labels(path.read_text(encoding="utf-8"))
    except OSError:
        return None
    try:
        return Mode(labels[MODE_LABEL])
    except (KeyError, ValueError):
        return None


def read_admin_token(settings: RuntimeSettings) -> str | None:
    """The admin token, re-read from its file each call so a rotated Secret takes effect."""
    if settings.admin_token_file is not None:
        try:
            token = settings.admin_token_file.read_text(encoding="utf-8").strip()
        except OSError:
            token = ""
        if token:
            return token
    if settings.admin_token is not None and settings.admin_token.get_secret_value():
        return settings.admin_token.get_secret_value()
    return None


def load_runtime_config(settings: RuntimeSettings) -> RuntimeConfig:
    file = read_config_file(settings.config_file)
    engine = file.engine
    if engine is None and settings.model:
        engine = EngineSettings(
            model=settings.model,
            served_model_name=file.served_model_name or DEFAULT_SERVED_MODEL_NAME,
            max_model_len=file.max_model_len or 2048,
            max_num_seqs=file.profiles.envelope_max_num_seqs,
        )
    elif engine is not None and settings.model:
        engine = engine.model_copy(update={"model": settings.model})
    served = file.served_model_name or (engine.served_model_name if engine else None)
    max_model_len = file.max_model_len or (engine.max_model_len if engine else None) or 2048
    if file.default_max_tokens > max_model_len:
        raise ConfigError(
            f"defaultMaxTokens {file.default_max_tokens} exceeds maxModelLen {max_model_len}"
        )
    return RuntimeConfig(
        profiles=file.profiles,
        served_model_name=served or DEFAULT_SERVED_MODEL_NAME,
        max_model_len=max_model_len,
        default_max_tokens=file.default_max_tokens,
        initial_mode=mode_from_labels(settings.labels_file) or file.initial_mode,
        engine=engine,
        max_body_bytes=settings.max_body_bytes,
        drain_grace_seconds=settings.drain_grace_seconds,
        max_chars_per_token=settings.max_chars_per_token,
        gpu_metrics=settings.gpu_metrics,
    )
