"""Every version of one object that a watch delivers, with when it arrived (`kubectl get -w`).

A state that holds for one reconcile iteration (status.autoscaling.reason ScaledUp, which the
next second's FleetFitsDemand replaces) is one a poll every half second can miss; a watch
delivers each version written. A watch the apiserver ends is opened again (its first answer,
the object as it is, is recorded once: versions are kept by resourceVersion).

    with History(cluster, ns, "agd", "phone-9b") as agd:
        ...
        reasons = agd.values(lambda obj: obj["status"]["autoscaling"]["reason"])
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from testkit.localcluster import LocalCluster

T = TypeVar("T")


class History:
    def __init__(self, cluster: LocalCluster, namespace: str, kind: str, name: str) -> None:
        self._argv = [str(cluster.bin_dir / "kubectl"), "get", kind, name, "-n", namespace,
                      "-w", "-o", "json"]  # fmt: skip
        self._env = cluster.env
        self._versions: list[tuple[float, dict[str, Any]]] = []
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._follow, name=f"history-{name}", daemon=True)

    def start(self) -> History:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
        self._thread.join(timeout=10)

    def __enter__(self) -> History:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def versions(self) -> list[tuple[float, dict[str, Any]]]:
        """(time.time() it arrived, the object), oldest first."""
        with self._lock:
            return list(self._versions)

    def values(self, read: Callable[[dict[str, Any]], T], since: float = 0.0) -> list[T]:
        """`read` of each version that arrived at or after `since`, a value repeated by the
        next version kept once: the changes of what `read` reads. A version `read` cannot
        read (a KeyError, say: no status yet) is skipped."""
        out: list[T] = []
        for at, obj in self.versions():
            if at < since:
                continue
            try:
                value = read(obj)
            except (KeyError, TypeError, IndexError):
                continue
            if not out or out[-1] != value:
                out.append(value)
        return out

    def first(self, check: Callable[[dict[str, Any]], bool], since: float = 0.0) -> float | None:
        """When the first version at or after `since` that passes `check` arrived."""
        for at, obj in self.versions():
            try:
                if at >= since and check(obj):
                    return at
            except (KeyError, TypeError, IndexError):
                continue
        return None

    def _follow(self) -> None:
        while not self._stop.is_set():
            self._proc = subprocess.Popen(self._argv, env=self._env, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True)  # fmt: skip
            assert self._proc.stdout is not None
            text: list[str] = []
            for line in self._proc.stdout:
                text.append(line)
                if line.rstrip("\n") == "}":  # -o json: each object ends at column 0
                    self._record("".join(text))
                    text = []
            self._proc.wait()
            self._stop.wait(0.5)

    def _record(self, text: str) -> None:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            return
        version = str(obj.get("metadata", {}).get("resourceVersion"))
        with self._lock:
            if version not in self._seen:
                self._seen.add(version)
                self._versions.append((time.time(), obj))
