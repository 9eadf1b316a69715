"""`autoglm-runtime serve` as PID-1 would run it: a stand-in `vllm` on PATH runs the sim.

Checks what only a real process tree shows: the launcher serves the admin API on its own port
and relays it into the engine's middleware; the engine's environment holds no admin token; on
SIGTERM the launcher drains the child through the relay before forwarding the signal, and exits
with the child's status.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable
from pathlib import Path

import httpx
import pytest

from autoglm_api.profiles import MODE_PATH
from testkit.processes import free_port
from testkit.procfs import descendants, environ
from testkit.waiting import eventually_async

pytestmark = pytest.mark.timeout(90)

TOKEN = "launcher-test-token"
FAKE_VLLM = """#!{python}
# Stands in for `vllm serve <model> --port N ...`: runs the sim on that port instead, with the
# environment the launcher gives vLLM (its middleware listens on AUTOGLM_ADMIN_SOCKET).
import sys
from testkit.sim.__main__ import main
args = sys.argv[1:]
assert args[0] == "serve", args
port = args[args.index("--port") + 1]
sys.exit(main(["--port", port, "--time-factor", "0.25"]))
"""


async def _status_is(reply: Awaitable[httpx.Response], status: int) -> bool:
    return (await reply).status_code == status


async def test_the_launcher_serves_the_admin_api_and_drains_before_forwarding(
    tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vllm"
    fake.write_text(FAKE_VLLM.format(python=sys.executable))
    fake.chmod(0o755)
    token_file = tmp_path / "admin" / "token"
    token_file.parent.mkdir()
    token_file.write_text(TOKEN + "\n")
    port, admin_port = free_port(), free_port()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "AUTOGLM_CONFIG_FILE": str(tmp_path / "none.json"),
           "AUTOGLM_LABELS_FILE": str(tmp_path / "labels"),
           "AUTOGLM_ADMIN_TOKEN_FILE": str(token_file),
           "AUTOGLM_ADMIN_PORT": str(admin_port),
           "AUTOGLM_DRAIN_GRACE_SECONDS": "30"}
    env.pop("AUTOGLM_ADMIN_TOKEN", None)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "autoglm_runtime.cli", "serve", "--",
         "/models/autoglm", "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    admin_url = f"http://127.0.0.1:{admin_port}{MODE_PATH}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            await eventually_async(lambda: _status_is(http.get("/health"), 200), 20,
                                   ignoring=(httpx.TransportError,),
                                   what="the engine under the launcher healthy")

            # The engine (the launcher's child) has the relay socket, never the token.
            (engine,) = descendants(launcher.pid)
            engine_env = environ(engine)
            assert not {"AUTOGLM_ADMIN_TOKEN", "AUTOGLM_ADMIN_TOKEN_FILE"} & engine_env.keys()
            assert not any(TOKEN in value for value in engine_env.values())
            relay_folder = Path(engine_env["AUTOGLM_ADMIN_SOCKET"]).parent
            assert relay_folder.stat().st_mode & 0o777 == 0o700

            # The admin API is the launcher's port's, relayed into the engine's middleware.
            assert (await http.get(MODE_PATH, headers=auth)).status_code == 404
            assert (await http.get(admin_url)).status_code == 401
            flipped = await http.put(admin_url, json={"mode": "batching"}, headers=auth)
            assert flipped.status_code == 200 and flipped.json()["mode"] == "batching"
            assert 'autoglm_mode{mode="batching"} 1.0' in (await http.get("/metrics")).text
            # The mounted token is read again on every call: a rotated one takes over.
            token_file.write_text("rotated\n")
            assert (await http.get(admin_url, headers=auth)).status_code == 401
            rotated = {"Authorization": "Bearer rotated"}
            assert (await http.get(admin_url, headers=rotated)).status_code == 200

            body = {"model": "autoglm-phone-9b", "max_tokens": 150, "ignore_eos": True,
                    "messages": [{"role": "user", "content": "long task"}]}
            running = asyncio.create_task(http.post("/v1/chat/completions", json=body))

            async def admitted() -> bool:
                return (await http.get(admin_url, headers=rotated)).json()["inflight"] >= 1

            # Admitted before the signal, or it is refused.
            await eventually_async(admitted, 10, every=0.05, what="the request admitted")
            launcher.send_signal(signal.SIGTERM)
            await eventually_async(lambda: _status_is(http.get("/health"), 503), 5, every=0.05,
                                   what="health going 503")
            assert (await http.post("/v1/chat/completions", json=body)).status_code == 503
            response = await running
        assert response.status_code == 200
        assert response.json()["usage"]["completion_tokens"] == 150
        code = await asyncio.to_thread(launcher.wait, 30)
        output = launcher.stdout.read().decode() if launcher.stdout else ""
        assert code == 0, output
        assert "Started draining" in output
        # The launcher saw the engine idle through the relay before it signalled.
        assert "Drained: nothing in flight; forwarding signal 15" in output
        assert not relay_folder.exists()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
