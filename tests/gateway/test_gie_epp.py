"""GIE's own endpoint picker, built from the Go module proxy (hack/gie-epp.sh, cached by version),
starts against the local control plane, finds the serving pods through the InferencePool the
operator publishes, and picks a pod for a chat sent through real Envoy (testkit.gie)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from testkit import gie


@pytest.fixture(scope="module")
def probed() -> dict[str, object]:
    """`python -m testkit.gie probe`'s findings: its own network namespace, two sims as pods."""
    env = {**os.environ, **gie.prepare()}  # outside the namespace: a cold build fetches modules
    argv = gie.isolated([sys.executable, "-m", "testkit.gie", "probe", "--inside"])
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_the_epp_runs_where_only_loopback_reaches_it(probed: dict[str, object]) -> None:
    # It listens on every interface (no flag binds loopback): its namespace has no other.
    assert probed["interfaces"] == ["lo"]


def test_the_epp_is_ready_once_it_holds_the_pools_pods(probed: dict[str, object]) -> None:
    assert probed["health"] == {"liveness": "SERVING", "readiness": "SERVING",
                                "(empty)": "SERVING"}  # fmt: skip
    assert probed["ext_proc_health"] == "SERVING"  # what Envoy's health check asks
    assert probed["ready_pods"] == 2


def test_envoy_sends_the_chat_to_the_one_pod_the_epp_picked(probed: dict[str, object]) -> None:
    # The pool's cluster is ORIGINAL_DST on x-gateway-destination-endpoint: without the EPP's
    # header Envoy has nowhere to send the request.
    assert sorted(probed["served"]) == [0.0, 1.0]  # type: ignore[call-overload]
    assert probed["content"]
