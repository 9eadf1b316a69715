"""spec.autoscaling through one reconcile iteration (iteration.plan_iteration): the serving
Deployment runs the fleet's size, scale to zero idles at minReplicas and wakes what the held
requests need, and a step down names its victims."""

from __future__ import annotations

from typing import Any

from test_fleet_plan import T0, demand, raw_spec
from test_reconcile_pass import NAME, NS, UID, body

from autoglm_api.standby import Activity
from autoglm_operator.adaptive.decision import iso_time
from autoglm_operator.adaptive.signals import Samples
from autoglm_operator.reconcile.children import serving
from autoglm_operator.reconcile.iteration import Inputs, IterationPlan, plan_iteration
from autoglm_operator.reconcile.memory import ReconcileMemory
from autoglm_operator.reconcile.observe import Observed
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec

IDLE = 900  # scaleToZero.idleSeconds, the default


def pod(name: str, ready: bool = True, mode: str = "streaming") -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "resourceVersion": "7",
                     "labels": {"autoglm.io/mode": mode}},
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pods(n: int, ready: bool = True) -> list[dict[str, Any]]:
    return [pod(f"p{i}", ready) for i in range(n)]


class Deployment:
    """One AutoGLMDeployment's iterations over time, each from the status the last one
    settled (as the status write and the watch bring it back)."""

    def __init__(self, spec: dict[str, Any], status: dict[str, Any] | None = None) -> None:
        self.spec = spec
        self.status: dict[str, Any] = dict(status or {})

    def at(
        self,
        now: float,
        running: list[dict[str, Any]],
        samples: Samples | None = None,
        activity: Activity | None = None,
        inflight: dict[str, int] | None = None,
    ) -> IterationPlan:
        observed = Observed(body=body(self.spec, status=self.status), deployment=None,
                            children={}, secret=None, pods=running)
        inputs = Inputs(
            owner=serving.Owner(NAME, NS, UID), observed=observed,
            spec=AutoGLMDeploymentSpec.model_validate(self.spec), generation=1, now=now,
            activity=activity or Activity(), samples=samples, inflight=inflight or {},
        )  # fmt: skip
        plan = plan_iteration(inputs, ReconcileMemory(), 0.0)
        self.status = plan.status.status
        return plan

    def state(self) -> str | None:
        return (self.status.get("standby") or {}).get("state")


def deployment_replicas(plan: IterationPlan) -> int:
    """spec.replicas of the serving Deployment the iteration applies."""
    assert plan.children is not None
    (replicas,) = [a.manifest["spec"]["replicas"] for a in plan.children.actions
                   if a.key == ("Deployment", NAME)]
    return int(replicas)


def test_the_serving_deployment_runs_the_fleets_size() -> None:
    crowd = Deployment(raw_spec(replicas=1))
    plan = crowd.at(T0, pods(1), demand(10.0))  # 12/s with the headroom: 3 at 4.1/s each
    assert deployment_replicas(plan) == 3
    assert crowd.status["autoscaling"]["desiredReplicas"] == 3
    assert [e.reason for e in plan.fleet.events] == ["ScaledUp"]
    # The next second, the new pods still starting: the count stands, no second step.
    assert deployment_replicas(crowd.at(T0 + 1, pods(1), demand(10.0))) == 3
    # spec.replicas is not what runs: 5 asked by hand, 1 is what the demand needs.
    quiet = Deployment(raw_spec(replicas=5))
    assert deployment_replicas(quiet.at(T0, pods(1), demand(1.0))) == 1


def test_at_min_replicas_zero_the_deployment_idles_at_zero_and_a_wake_starts_what_is_held() -> None:
    """Idle after scaleToZero.idleSeconds; the wake starts ceil(held / 64) replicas at once
    (no one-replica wokenReplicas stage), and the fleet keeps them."""
    zero = Deployment(raw_spec(minReplicas=0))
    last = Activity(last_request_at=T0)
    assert deployment_replicas(zero.at(T0, pods(2), activity=last)) == 2
    idle = zero.at(T0 + IDLE, pods(2), activity=last)
    assert deployment_replicas(idle) == 0
    assert zero.state() == "Idle"
    assert deployment_replicas(zero.at(T0 + IDLE + 1, [], activity=last)) == 0
    arrived = T0 + IDLE + 100
    held = Activity(last_request_at=T0, holding=130, held_since=arrived)
    waking = zero.at(arrived + 1, [], activity=held)
    assert deployment_replicas(waking) == 3
    assert zero.state() == "Waking"
    assert [e.reason for e in waking.standby.events] == ["Waking"]
    starting = [pod("a"), pod("b", ready=False), pod("c", ready=False)]
    woke = zero.at(arrived + 60, starting, activity=held)
    assert deployment_replicas(woke) == 3 and zero.state() == "Serving"
    assert zero.status["standby"].get("wokenReplicas") is None
    relayed = Activity(last_request_at=arrived + 61, inflight=130)
    assert deployment_replicas(zero.at(arrived + 61, pods(3), activity=relayed)) == 3


def test_a_wake_for_one_held_request_starts_one_replica() -> None:
    zero = Deployment(raw_spec(minReplicas=0),
                      {"standby": {"state": "Idle", "since": iso_time(T0 - 100)},
                       "autoscaling": {"desiredReplicas": 1}})
    plan = zero.at(T0, [], activity=Activity(holding=1, held_since=T0 - 1))
    assert deployment_replicas(plan) == 1 and zero.state() == "Waking"


def test_a_step_down_below_the_live_pods_names_its_victim() -> None:
    stepping = Deployment(raw_spec(), {"autoscaling": {
        "desiredReplicas": 3, "lowerSince": iso_time(T0 - 1000)}})
    inflight = {"p0": 5, "p1": 1, "p2": 3}
    plan = stepping.at(T0, pods(3), demand(1.0), inflight=inflight)
    assert deployment_replicas(plan) == 2
    assert plan.victims == ("p1",)  # the fewest requests in flight
    # The next second the step is taken (the victim still drains): nothing more to mark.
    after = stepping.at(T0 + 1, pods(3), demand(1.0), inflight=inflight)
    assert deployment_replicas(after) == 2 and after.victims == ()


def test_a_pod_that_is_not_ready_is_the_victim_before_an_idle_one() -> None:
    stepping = Deployment(raw_spec(), {"autoscaling": {
        "desiredReplicas": 3, "lowerSince": iso_time(T0 - 1000)}})
    running = [pod("p0"), pod("p1", ready=False), pod("p2")]
    plan = stepping.at(T0, running, demand(1.0), inflight={"p0": 0, "p1": 4, "p2": 0})
    assert plan.victims == ("p1",)


def test_a_rollouts_surge_pod_is_no_victim() -> None:
    steady = Deployment(raw_spec(), {"autoscaling": {"desiredReplicas": 3}})
    surge = [*pods(3), pod("new", ready=False)]
    plan = steady.at(T0, surge, demand(10.0))
    assert deployment_replicas(plan) == 3 and plan.victims == ()
