"""Lease-based leader election against an in-memory apiserver."""

from __future__ import annotations

import threading
import time

import pytest
from operator_fakes import FakeKube

from autoglm_operator.io import kube, leader


def elector(api: FakeKube, identity: str, lease_seconds: int = 30) -> leader.LeaderElector:
    return leader.LeaderElector(api, "ops", identity, lease_seconds=lease_seconds)  # type: ignore[arg-type]


def test_first_replica_takes_the_lease_and_the_second_waits() -> None:
    api = FakeKube()
    one, two = elector(api, "one"), elector(api, "two")
    assert one.try_acquire()
    assert not two.try_acquire()
    assert api.objects[("Lease", "ops", "autoglm-operator")]["spec"]["holderIdentity"] == "one"
    assert one.renew() and not two.try_acquire()


def test_renewal_is_one_write_without_a_read() -> None:
    api = FakeKube()
    one = elector(api, "one")
    assert one.try_acquire()
    api.calls.clear()
    assert one.renew()
    assert api.calls == [("replace", "Lease", "autoglm-operator")]


def test_a_standby_takes_over_a_lease_not_renewed_for_its_duration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = FakeKube()
    one, two = elector(api, "one", lease_seconds=10), elector(api, "two", lease_seconds=10)
    assert one.try_acquire()
    clock = [1000.0]
    monkeypatch.setattr(leader.time, "monotonic", lambda: clock[0])
    assert not two.try_acquire()  # first sight of the record starts the standby's clock
    clock[0] += 9
    assert not two.try_acquire()
    clock[0] += 2
    assert two.try_acquire()
    lease = api.objects[("Lease", "ops", "autoglm-operator")]["spec"]
    assert lease["holderIdentity"] == "two" and lease["leaseTransitions"] == 1
    # The old holder's next renewal conflicts, and it sees it no longer leads.
    assert not one.renew()


def test_release_lets_a_standby_lead_at_once() -> None:
    api = FakeKube()
    one, two = elector(api, "one"), elector(api, "two")
    assert one.try_acquire()
    one.release()
    assert two.try_acquire()


def test_losing_the_lease_calls_back_and_stops_renewing() -> None:
    api = FakeKube()
    one = leader.LeaderElector(api, "ops", "one", lease_seconds=3, renew_seconds=0.05)  # type: ignore[arg-type]
    assert one.try_acquire()
    lost = threading.Event()
    stop = threading.Event()
    # Someone else writes the Lease: the next renewal conflicts, the re-read shows another holder.
    record = api.objects[("Lease", "ops", "autoglm-operator")]
    record["spec"]["holderIdentity"] = "intruder"
    record["metadata"]["resourceVersion"] = "999"
    one.keep(stop, on_lost=lost.set)
    assert lost.wait(5)
    assert one.lost.is_set()
    stop.set()


def test_api_errors_while_renewing_are_tolerated_until_the_lease_would_expire() -> None:
    api = FakeKube()
    one = leader.LeaderElector(api, "ops", "one", lease_seconds=1, renew_seconds=0.1)  # type: ignore[arg-type]
    assert one.try_acquire()
    api.fail_with = kube.ApiError(503, "ServiceUnavailable", "etcd is down")
    lost, stop = threading.Event(), threading.Event()
    started = time.monotonic()
    one.keep(stop, on_lost=lost.set)
    assert lost.wait(5)
    assert time.monotonic() - started >= 0.8  # it kept trying for most of the lease
    stop.set()


def test_acquire_returns_when_stopped() -> None:
    api = FakeKube()
    assert elector(api, "one").try_acquire()
    stop = threading.Event()
    stop.set()
    assert not elector(api, "two").acquire(stop)
