"""Leader election on a coordination.k8s.io Lease, held before kopf starts.

Only the holder runs kopf, so two replicas of the operator never write the same objects. The
holder renews the Lease every `renew_seconds`; a standby takes over when the record has not
changed for `lease_seconds` by its own clock (as client-go does, so clock skew between nodes
does not matter), or at once when the holder released it on a clean exit.
"""

from __future__ import annotations

import datetime
import http.server
import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from autoglm_operator.io import kube

log = logging.getLogger(__name__)
REQUEST_JOIN_SECONDS = kube.REQUEST_TIMEOUT_SECONDS + 5


def _micro_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        client: kube.Kube,
        namespace: str,
        identity: str,
        name: str = "autoglm-operator",
        lease_seconds: int = 30,
        renew_seconds: float = 10.0,
        retry_seconds: float = 2.0,
    ) -> None:
        self.kube = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.retry_seconds = retry_seconds
        self.lease: dict[str, Any] | None = None
        self.lost = threading.Event()
        self._observed: tuple[str, float] | None = None  # (record, monotonic time first seen)
        self.thread: threading.Thread | None = None

    def _manifest(self, transitions: int, acquired: str) -> dict[str, Any]:
        now = _micro_now()
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_seconds,
                "acquireTime": acquired,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }

    def try_acquire(self) -> bool:
        """One attempt to take or renew the Lease; True while this process holds it."""
        lease = self.kube.get("Lease", self.namespace, self.name)
        if lease is None:
            created = self.kube.create(self._manifest(0, _micro_now()))
            self.lease = created
            return created is not None
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = f"{holder}|{spec.get('renewTime')}"
        if self._observed is None or self._observed[0] != record:
            self._observed = (record, time.monotonic())
        expired = time.monotonic() - self._observed[1] > int(
            spec.get("leaseDurationSeconds") or self.lease_seconds
        )
        if holder and holder != self.identity and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        acquired = spec.get("acquireTime") or _micro_now()
        if holder != self.identity:
            transitions, acquired = transitions + 1, _micro_now()
        manifest = self._manifest(transitions, acquired)
        manifest["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
        try:
            self.lease = self.kube.replace(manifest)
        except kube.ApiError as err:
            if err.status == 409:
                return False  # someone else wrote first
            raise
        return True

    def renew(self) -> bool:
        """Renew from the last written record: one PUT, no GET, while nothing interferes."""
        if self.lease is None:
            return self.try_acquire()
        spec = self.lease["spec"]
        manifest = self._manifest(int(spec.get("leaseTransitions") or 0), spec["acquireTime"])
        manifest["metadata"]["resourceVersion"] = self.lease["metadata"]["resourceVersion"]
        try:
            self.lease = self.kube.replace(manifest)
            return True
        except kube.ApiError as err:
            if err.status == 409:
                self.lease = None
                return self.try_acquire()
            raise

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this process leads (True) or `stop` is set (False)."""
        announced = False
        while not stop.is_set():
            try:
                if self.try_acquire():
                    log.info(f"Acquired leadership of Lease {self.namespace}/{self.name}")
                    return True
            except kube.ApiError as err:
                log.warning(f"Lease {self.name}: {err}")
            if not announced:
                log.info(f"Waiting for Lease {self.namespace}/{self.name} (another replica leads)")
                announced = True
            stop.wait(self.retry_seconds)
        return False

    def keep(
        self, stop: threading.Event, on_lost: Callable[[], object] = lambda: None
    ) -> threading.Thread:
        """Renew in the background until `stop`; on losing the Lease set `lost`, call `on_lost`."""

        def loop() -> None:
            last_ok = time.monotonic()
            while not stop.wait(self.renew_seconds):
                try:
                    if self.renew():
                        last_ok = time.monotonic()
                        continue
                    log.error(f"Lost Lease {self.name} to another replica")
                except kube.ApiError as err:
                    log.warning(f"Could not renew Lease {self.name}: {err}")
                    if time.monotonic() - last_ok < self.lease_seconds - self.renew_seconds:
                        continue
                    log.error(f"Lease {self.name} not renewed in time; stepping down")
                self.lost.set()
                on_lost()
                return

        self.thread = threading.Thread(target=loop, name="lease-renewal", daemon=True)
        self.thread.start()
        return self.thread

    def release(self) -> None:
        """Hand the Lease back on a clean exit so a standby takes over at once."""
        if self.thread is not None:
            self.thread.join(timeout=REQUEST_JOIN_SECONDS)  # no renewal racing the release
        if self.lease is None or self.lost.is_set():
            return
        spec = self.lease["spec"]
        manifest = self._manifest(int(spec.get("leaseTransitions") or 0), spec["acquireTime"])
        manifest["spec"]["holderIdentity"] = None
        manifest["spec"]["leaseDurationSeconds"] = 1
        manifest["metadata"]["resourceVersion"] = self.lease["metadata"]["resourceVersion"]
        try:
            self.kube.replace(manifest)
            log.info(f"Released Lease {self.namespace}/{self.name}")
        except kube.ApiError as err:
            log.warning(f"Could not release Lease {self.name}: {err}")


class StandbyProbe:
    """Answers the liveness endpoint while this replica waits to lead (kopf's is not up yet)."""

    def __init__(self, endpoint: str) -> None:
        url = urlparse(endpoint)
        self.path = url.path or "/"

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(handler) -> None:
                ok = handler.path.split("?")[0] == self.path
                handler.send_response(200 if ok else 404)
                handler.send_header("Content-Type", "application/json")
                handler.end_headers()
                handler.wfile.write(b'{"standby": true}' if ok else b"{}")

            def log_message(handler, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((url.hostname or "", url.port or 80), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandbyProbe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
