"""The container entrypoint: run `vllm serve` with our middleware and drain it on SIGTERM.

The launcher is PID 1 of the serving container. On SIGTERM it first drains the child through the
middleware's drain endpoint (readiness fails, new requests get 503, admitted ones finish), waits
until nothing is in flight or the grace period ends, and only then passes the signal on, so
vLLM's own shutdown finds an idle engine. A second signal is forwarded at once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from types import FrameType

from autoglm_runtime.config import ConfigError, RuntimeSettings, load_runtime_config
from autoglm_runtime.engine_args import (
    API_KEY_FLAG_MESSAGE,
    ENGINE_ENV,
    api_key_flags,
    build_vllm_argv,
    refused_extra_arg,
)
from autoglm_runtime.keepalive import SERVER_KEEP_ALIVE_SECONDS, VLLM_KEEP_ALIVE_ENV
from autoglm_runtime.profiles import DRAIN_PATH, MODE_PATH

log = logging.getLogger("autoglm_runtime.launcher")

NOT_INSTALLED = (
    "vLLM is not installed here, so `autoglm-runtime serve` cannot start the engine. "
    "Install the `vllm` extra on a machine with a GPU, or run the CPU engine that serves the "
    "same API: `autoglm-runtime sim --host 127.0.0.1 --port 8000`."
)


class VLLMNotInstalled(RuntimeError):
    pass


def vllm_command() -> list[str]:
    """How to invoke `vllm`: its console script, else the module, else an error."""
    found = shutil.which("vllm")
    if found:
        return [found]
    if importlib.util.find_spec("vllm") is not None:
        return [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    raise VLLMNotInstalled(NOT_INSTALLED)


def serve_argv(settings: RuntimeSettings, passthrough: Sequence[str]) -> list[str]:
    """The args after `vllm serve`: given ones verbatim, else built from the config."""
    if passthrough:
        argv = list(passthrough)
    else:
        config = load_runtime_config(settings)
        if config.engine is None:
            raise ConfigError(
                f"no model to serve: set AUTOGLM_MODEL, put an `engine` object in "
                f"{settings.config_file}, or pass vLLM args after `--`"
            )
        if refused := [why for arg in config.engine.extra_args if (why := refused_extra_arg(arg))]:
            raise ConfigError("engine.extraArgs: " + "; ".join(refused))
        argv = build_vllm_argv(config.engine)
    if flags := api_key_flags(argv):
        # vLLM would check such a key only after the middleware had admitted the request.
        raise ConfigError(f"{API_KEY_FLAG_MESSAGE}; got {', '.join(flags)}")
    return argv


# The engine's --max-num-seqs, for its middleware (config.RuntimeSettings.engine_max_num_seqs).
ENGINE_MAX_NUM_SEQS_ENV = "AUTOGLM_ENGINE_MAX_NUM_SEQS"


def int_flag(argv: Sequence[str], flag: str) -> int | None:
    """The integer value of `flag` in vLLM args (`--flag N` or `--flag=N`); None if absent."""
    for index, arg in enumerate(argv):
        if arg == flag and index + 1 < len(argv):
            with contextlib.suppress(ValueError):
                return int(argv[index + 1])
        elif arg.startswith(flag + "="):
            with contextlib.suppress(ValueError):
                return int(arg.split("=", 1)[1])
    return None


def port_of(argv: Sequence[str], default: int = 8000) -> int:
    port = int_flag(argv, "--port")
    return default if port is None else port


def engine_env(environ: Mapping[str, str], drain_token: str,
               argv: Sequence[str] = ()) -> dict[str, str]:
    """The engine's environment: the pod's, what the engine must run with (ENGINE_ENV), the
    drain token, the engine's sequence limit for the middleware's admission, and a keep-alive
    that outlasts the clients' (keepalive.py) unless the pod sets its own."""
    env = {**environ, **ENGINE_ENV, "AUTOGLM_DRAIN_TOKEN": drain_token}
    if (max_num_seqs := int_flag(argv, "--max-num-seqs")) is not None:
        env[ENGINE_MAX_NUM_SEQS_ENV] = str(max_num_seqs)
    env.setdefault(VLLM_KEEP_ALIVE_ENV, str(SERVER_KEEP_ALIVE_SECONDS))
    return env


class Launcher:
    def __init__(self, command: list[str], port: int, grace_seconds: float) -> None:
        self.command = command
        self.port = port
        self.grace_seconds = grace_seconds
        self.drain_token = secrets.token_urlsafe(32)
        self.process: subprocess.Popen[bytes] | None = None
        self._signalled = threading.Event()
        self._drainer: threading.Thread | None = None

    def run(self) -> int:
        env = engine_env(os.environ, self.drain_token, self.command)
        log.info("Starting %s", " ".join(self.command))
        self.process = subprocess.Popen(self.command, env=env)
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            code = self.process.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        # A child killed by a signal reports -N; shells and kubelet expect 128+N.
        return 128 - code if code < 0 else code

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self._signalled.is_set():
            self._forward(signum)  # second signal: no more patience
            return
        self._signalled.set()
        self._drainer = threading.Thread(target=self._drain_then_forward, args=(signum,),
                                         daemon=True)
        self._drainer.start()

    def _forward(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def _drain_then_forward(self, signum: int) -> None:
        try:
            if self._request("POST", DRAIN_PATH) is None:
                # Not serving yet (still loading) or no middleware: nothing to drain.
                self._forward(signum)
                return
            deadline = time.monotonic() + self.grace_seconds
            while time.monotonic() < deadline:
                state = self._request("GET", MODE_PATH)
                if state is not None and state.get("inflight") == 0 and state.get("queued") == 0:
                    log.info("Drained: nothing in flight; forwarding signal %d", signum)
                    break
                time.sleep(0.2)
            else:
                log.warning("Grace period of %g s ended; forwarding signal %d",
                            self.grace_seconds, signum)
        except Exception:
            log.exception("draining failed; stopping the engine anyway")
        self._forward(signum)

    def _request(self, method: str, path: str) -> dict[str, object] | None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            method=method,
            headers={"Authorization": f"Bearer {self.drain_token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                data = json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            log.warning("%s %s failed: %s", method, path, exc)
            return None
        return data if isinstance(data, dict) else None


def serve(settings: RuntimeSettings, passthrough: Sequence[str]) -> int:
    argv = serve_argv(settings, passthrough)
    command = [*vllm_command(), "serve", *argv]
    return Launcher(command, port_of(argv), settings.drain_grace_seconds).run()
