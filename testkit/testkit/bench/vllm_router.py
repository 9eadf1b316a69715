"""vLLM's Rust router (`vllm-router` from PyPI) for the benchmarks that compare with it.

hack/vllm-router-env.sh installs it once into its own venv under ~/.cache/autoglm; `argv` is
the command line both benchmarks run it with: `--policy consistent_hash` (keyed by the
`X-Session-ID` header), its metrics on a port of their own.
"""

from __future__ import annotations

import subprocess

from testkit.paths import REPO
from testkit.processes import free_port


def find_binary() -> str:
    out = subprocess.run(["bash", str(REPO / "hack" / "vllm-router-env.sh")], check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    return out.strip().splitlines()[-1]


def argv(binary: str, port: int, workers: list[str]) -> list[str]:
    return [binary, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
            "--policy", "consistent_hash", "--prometheus-port", str(free_port()),
            "--log-level", "warning"]  # fmt: skip
