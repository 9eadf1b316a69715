"""switchStrategy Rolling on the real control plane: a flip replaces pods, make-before-break.

kwok makes the GPU pods Ready without running anything, so this checks the orchestration: each
new pod (the other mode's template, with that mode's engine flags) is Ready before an old pod is
deleted, and ready replicas never fall below the PodDisruptionBudget's floor.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest
import urllib3
from kubernetes import client, config, watch

from testkit.localcluster import LocalCluster
from testkit.operator_kit import (
    INSTANCE,
    KUBECTL_FAILED,
    MODE_LABEL,
    NAME,
    Operator,
    agd_object,
    condition,
    deploy,
    events,
    get,
    live_pods,
    patch_agd,
    status,
)
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(300)


class PodWatch:
    """Every pod event of the deployment, in the apiserver's order, with our receive time."""

    def __init__(self, cluster: LocalCluster, namespace: str) -> None:
        api_client = config.new_client_from_config(config_file=cluster.env["KUBECONFIG"])
        self.api = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.rows: list[dict[str, Any]] = []
        self.watch = watch.Watch()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PodWatch:
        self.thread.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *_: Any) -> None:
        self.watch.stop()

    def _run(self) -> None:
        with contextlib.suppress(urllib3.exceptions.HTTPError):
            self._stream()

    def _stream(self) -> None:
        for event in self.watch.stream(
            self.api.list_namespaced_pod, self.namespace, label_selector=INSTANCE,
            timeout_seconds=240,
        ):  # fmt: skip
            pod = event["object"]
            ready = any(
                c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
            )
            self.rows.append(
                {
                    "t": time.monotonic(),
                    "type": event["type"],
                    "name": pod.metadata.name,
                    "mode": (pod.metadata.labels or {}).get(MODE_LABEL),
                    "ready": ready,
                    "terminating": pod.metadata.deletion_timestamp is not None,
                }
            )

    def serving(self, initial: int) -> list[tuple[float, int]]:
        """(time, ready pods not being deleted) after each event past the first `initial`
        (the watch starts with an ADDED event for each pod that exists)."""
        state: dict[str, bool] = {}
        out = []
        for i, row in enumerate(self.rows):
            gone = row["type"] == "DELETED" or row["terminating"]
            state[row["name"]] = row["ready"] and not gone
            if i >= initial - 1:
                out.append((row["t"], sum(state.values())))
        return out

    def seen(self, name: str, **match: Any) -> bool:
        """Whether the watch has delivered an event of `name` matching every field given (it
        may lag the test's own reads)."""
        return any(r["name"] == name and all(r[k] == v for k, v in match.items())
                   for r in list(self.rows))  # fmt: skip

    def first(self, name: str, **match: Any) -> int:
        """Index of the first event of `name` matching every field given."""
        return next(
            i
            for i, r in enumerate(self.rows)
            if r["name"] == name and all(r[k] == v for k, v in match.items())
        )


def args_of(pod: dict[str, Any]) -> list[str]:
    return list(pod["spec"]["containers"][0]["args"])


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def switch(
    cluster: LocalCluster, ns: str, to: str, old: set[str], seen_transitioning: list[bool]
) -> tuple[dict[str, Any], PodWatch, float]:
    """Pin every replica to `to`; return the settled status, the pod events, seconds taken."""
    with PodWatch(cluster, ns) as pods:
        started = time.monotonic()
        patch_agd(cluster, ns, {"spec": {"modePolicy": to.capitalize()}})

        def settled() -> dict[str, Any] | None:
            st = status(cluster, ns)
            if condition(st, "ModeTransitioning").get("status") == "True":
                seen_transitioning.append(True)
            live = live_pods(cluster, ns)
            last = st.get("lastDecision") or {}
            done = (
                len(live) == 2
                and all(p["metadata"]["labels"].get(MODE_LABEL) == to for p in live)
                and not {p["metadata"]["name"] for p in live} & old
                and st.get(f"{to}Replicas") == 2
                and last.get("applied") is True
                and last.get("toBatching") == (2 if to == "batching" else 0)
                and condition(st, "ModeTransitioning").get("status") == "False"
                and all(pods.seen(name, terminating=True) for name in old)
                and all(pods.seen(p["metadata"]["name"], ready=True) for p in live)
            )
            return st if done else None

        st = eventually(settled, 120, every=0.5, what=f"every pod {to}", ignoring=KUBECTL_FAILED)
        deleted_at = max(pods.rows[pods.first(name, terminating=True)]["t"] for name in old)
    return st, pods, deleted_at - started


def check_make_before_break(
    pods: PodWatch, old: set[str], new_mode: str, floor: int, replicas: int
) -> None:
    new = sorted({r["name"] for r in pods.rows if r["mode"] == new_mode} - old)
    assert len(new) == len(old) == replicas, pods.rows
    # Each old pod is deleted only after one more new pod than before had become Ready.
    deletions = sorted(pods.first(name, terminating=True) for name in old)
    readies = sorted(pods.first(name, ready=True) for name in new)
    for k, deleted in enumerate(deletions):
        assert readies[k] < deleted, (k, pods.rows)
    assert all(r["type"] == "ADDED" for r in pods.rows[:replicas])
    lowest = min(count for _, count in pods.serving(replicas))
    assert lowest >= floor, pods.serving(replicas)
    assert lowest >= replicas  # make-before-break: never a replica short


def test_rolling_switch_replaces_pods_make_before_break(
    cluster: LocalCluster, namespace: str, operator: Operator
) -> None:
    obj = agd_object(switchStrategy="Rolling", modePolicy="Streaming")
    obj["spec"]["adaptive"]["intervalSeconds"] = 5
    deploy(cluster, namespace, obj, "2/2")
    streaming = {p["metadata"]["name"] for p in live_pods(cluster, namespace)}
    for pod in live_pods(cluster, namespace):
        args = args_of(pod)
        assert flag(args, "--max-num-seqs") == "8" and "--stream-interval" not in args
    pdb = get(cluster, namespace, "pdb", NAME)["spec"]
    floor = 2 - int(pdb["maxUnavailable"]) if "maxUnavailable" in pdb else int(pdb["minAvailable"])

    transitioning: list[bool] = []
    st, pods, seconds = switch(cluster, namespace, "batching", streaming, transitioning)
    print(f"Rolling flip streaming -> batching of 2 replicas: {seconds:.1f}s to the last old pod")
    print(f"ModeTransitioning=True observed during the switch: {bool(transitioning)}")
    check_make_before_break(pods, streaming, "batching", floor, 2)
    batching = {p["metadata"]["name"] for p in live_pods(cluster, namespace)}
    for pod in live_pods(cluster, namespace):
        args = args_of(pod)
        assert flag(args, "--max-num-seqs") == "64" and flag(args, "--stream-interval") == "4"
    assert st["streamingReplicas"] == 0 and st["batchingReplicas"] == 2
    def replaced_reported() -> bool:  # ModeReplaced is posted after the status write
        reasons = [e["reason"] for e in events(cluster, namespace)]
        return reasons.count("PodReplaced") >= 2 and "ModeReplaced" in reasons

    eventually(replaced_reported, 15, every=0.5, what="PodReplaced and ModeReplaced events",
               ignoring=KUBECTL_FAILED)
    deployments = get(cluster, namespace, "deployments", "-l", INSTANCE)["items"]
    assert {d["metadata"]["name"]: d["spec"]["replicas"] for d in deployments} == {
        NAME: 0,
        f"{NAME}-batching": 2,
    }

    st, pods, seconds = switch(cluster, namespace, "streaming", batching, transitioning)
    print(f"Rolling flip batching -> streaming of 2 replicas: {seconds:.1f}s to the last old pod")
    check_make_before_break(pods, batching, "streaming", floor, 2)
    for pod in live_pods(cluster, namespace):
        args = args_of(pod)
        assert flag(args, "--max-num-seqs") == "8" and "--stream-interval" not in args
    assert st["streamingReplicas"] == 2 and st["batchingReplicas"] == 0
    assert condition(st, "Ready")["status"] == "True"

    # Back to InPlace: one Deployment again, with the envelope; `<name>-batching` goes once
    # `<name>` serves every replica.
    patch_agd(cluster, namespace, {"spec": {"switchStrategy": "InPlace"}})

    def in_place() -> bool:
        serving = get(cluster, namespace, "deployments", "-l", INSTANCE)["items"]
        names = {d["metadata"]["name"] for d in serving}
        live = live_pods(cluster, namespace)
        return (
            names == {NAME}
            and len(live) == 2
            and all(flag(args_of(p), "--max-num-seqs") == "64" for p in live)
            and status(cluster, namespace).get("ready") == "2/2"
        )

    eventually(in_place, 60, every=0.5, what="InPlace again", ignoring=KUBECTL_FAILED)
