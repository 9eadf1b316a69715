"""The container entrypoint: run `vllm serve` with our middleware, serve the admin API beside
it, and drain it on SIGTERM.

The launcher is PID 1 of the serving container. It serves the admin API on its own port
(admin.py): it holds the admin token, the engine never does, and relays each call to the
middleware over a Unix socket in a directory only this user may enter. On SIGTERM it first
drains the child through that relay (readiness fails, new requests get 503, admitted ones
finish), waits until nothing is in flight or the grace period ends, and only then passes the
signal on, so vLLM's own shutdown finds an idle engine. A second signal is forwarded at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from autoglm_api.engine_args import (
    API_KEY_FLAG_MESSAGE,
    ENGINE_ENV,
    api_key_flags,
    build_vllm_argv,
    refused_extra_arg,
)
from autoglm_api.keepalive import SERVER_KEEP_ALIVE_SECONDS, VLLM_KEEP_ALIVE_ENV
from autoglm_runtime.admin import AdminServer, Relay, RelayError, relay_socket, relay_to
from autoglm_runtime.config import (
    ConfigError,
    RuntimeSettings,
    load_runtime_config,
    read_admin_token,
)

log = logging.getLogger("autoglm_runtime.launcher")

NOT_INSTALLED = (
    "vLLM is not installed here, so `autoglm-runtime serve` cannot start the engine. "
    "Install the `vllm` extra on a machine with a GPU, or, in a checkout after `make venv`, run "
    "the CPU engine that serves the same API: `python -m testkit.sim --host 127.0.0.1 --port 8000`."
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
# Where the middleware listens for relayed admin calls (config.RuntimeSettings.admin_socket).
ADMIN_SOCKET_ENV = "AUTOGLM_ADMIN_SOCKET"
# What only the launcher reads: never in the engine's environment, which every vLLM process
# inherits (and /proc/<pid>/environ shows to the same user).
LAUNCHER_ONLY_ENV = ("AUTOGLM_ADMIN_TOKEN", "AUTOGLM_ADMIN_TOKEN_FILE")


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of `flag` in vLLM args (`--flag V` or `--flag=V`); None if absent."""
    for index, arg in enumerate(argv):
        if arg == flag and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def int_flag(argv: Sequence[str], flag: str) -> int | None:
    value = flag_value(argv, flag)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def engine_env(environ: Mapping[str, str], admin_socket: Path,
               argv: Sequence[str] = ()) -> dict[str, str]:
    """The engine's environment: the pod's without the admin token, what the engine must run
    with (ENGINE_ENV), the relay socket and the engine's sequence limit for the middleware, and
    a keep-alive that outlasts the clients' (keepalive.py) unless the pod sets its own."""
    env = {k: v for k, v in environ.items() if k not in LAUNCHER_ONLY_ENV}
    env.update({**ENGINE_ENV, ADMIN_SOCKET_ENV: str(admin_socket)})
    if (max_num_seqs := int_flag(argv, "--max-num-seqs")) is not None:
        env[ENGINE_MAX_NUM_SEQS_ENV] = str(max_num_seqs)
    env.setdefault(VLLM_KEEP_ALIVE_ENV, str(SERVER_KEEP_ALIVE_SECONDS))
    return env


class Launcher:
    def __init__(self, command: list[str], settings: RuntimeSettings) -> None:
        self.command = command
        self.settings = settings
        # The admin API listens where the API does: every interface unless --host says one.
        self.admin_host = flag_value(command, "--host")
        self.process: asyncio.subprocess.Process | None = None
        self._drainer: asyncio.Task[None] | None = None

    def run(self) -> int:
        return asyncio.run(self._run())

    async def _run(self) -> int:
        with relay_socket() as socket_path:
            relay = relay_to(socket_path)
            admin = AdminServer(lambda: read_admin_token(self.settings), relay)
            server = await admin.start(self.admin_host, self.settings.admin_port)
            env = engine_env(os.environ, socket_path, self.command)
            log.info("Starting %s", " ".join(self.command))
            self.process = await asyncio.create_subprocess_exec(*self.command, env=env)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig, relay)
            try:
                code = await self.process.wait()
            finally:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
                server.close()
                if self._drainer is not None:
                    self._drainer.cancel()
        # A child killed by a signal reports -N; shells and kubelet expect 128+N.
        return 128 - code if code < 0 else code

    def _on_signal(self, signum: int, relay: Relay) -> None:
        if self._drainer is not None:
            self._forward(signum)  # second signal: no more patience
            return
        self._drainer = asyncio.get_running_loop().create_task(
            self._drain_then_forward(signum, relay))

    def _forward(self, signum: int) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signum)

    async def _drain_then_forward(self, signum: int, relay: Relay) -> None:
        try:
            await self._drain(signum, relay)
        except Exception:
            log.exception("draining failed; stopping the engine anyway")
        self._forward(signum)

    async def _drain(self, signum: int, relay: Relay) -> None:
        """Drain through the relay, then wait until nothing is in flight or the grace ends."""
        grace = self.settings.drain_grace_seconds
        try:
            await relay({"op": "drain"})
        except RelayError as exc:
            # Not serving yet (still loading) or no middleware: nothing to drain.
            log.warning("Not drained (%s); forwarding signal %d", exc, signum)
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            with contextlib.suppress(RelayError):
                state = await relay({"op": "state"})
                if state.get("inflight") == 0 and state.get("queued") == 0:
                    log.info("Drained: nothing in flight; forwarding signal %d", signum)
                    return
            await asyncio.sleep(0.2)
        log.warning("Grace period of %g s ended; forwarding signal %d", grace, signum)


def serve(settings: RuntimeSettings, passthrough: Sequence[str]) -> int:
    command = [*vllm_command(), "serve", *serve_argv(settings, passthrough)]
    return Launcher(command, settings).run()
