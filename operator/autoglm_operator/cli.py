"""`autoglm-operator`: run the operator, or print the CRD.

    autoglm-operator run --namespace prod [--liveness http://0.0.0.0:8080/healthz]
    autoglm-operator run --all-namespaces
    autoglm-operator crd > crds/autoglm.io_autoglmdeployments.yaml
    autoglm-operator crd --reference > docs/reference/resource.md

Other subcommands plug in: a module listed in SUBCOMMAND_MODULES that defines
`add_parser(subparsers)` (setting `func` on its parser) appears here when it is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING

from autoglm_operator.handlers import settings as settings_

if TYPE_CHECKING:
    from autoglm_operator.io.leader import LeaderElector

SUBCOMMAND_MODULES = ("autoglm_operator.replay",)
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _import_optional(module: str) -> object | None:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return None
        raise


def load_handlers() -> list[str]:
    """Import every handler module that exists; kopf registers their handlers on import."""
    return [m for m in settings_.HANDLER_MODULES if _import_optional(m) is not None]


def _default_lease_namespace(args: argparse.Namespace) -> str:
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as file:
            return file.read().strip()
    except OSError:
        return str(args.namespace[0]) if args.namespace else "default"


def run(args: argparse.Namespace) -> int:
    import kopf

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    log = logging.getLogger("autoglm_operator")
    modules = load_handlers()
    log.info(f"Loaded handler modules: {', '.join(modules)}")

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    elector = _elector(args) if args.leader_election else None
    if elector is not None and not _lead(elector, args, stop):
        return 0

    async def operate() -> None:
        # kopf handles SIGTERM/SIGINT from here on; a lost Lease stops it through this event.
        loop = asyncio.get_running_loop()
        lost = asyncio.Event()
        if elector is not None:
            elector.keep(stop, on_lost=lambda: loop.call_soon_threadsafe(lost.set))
        await kopf.operator(
            standalone=True,  # leadership is the Lease's job: no KopfPeering objects needed
            clusterwide=args.all_namespaces,
            namespaces=args.namespace or (),
            liveness_endpoint=args.liveness,
            stop_flag=lost,
        )

    try:
        asyncio.run(operate())
    finally:
        stop.set()  # ends the renewal thread
        if elector is not None:
            elector.release()
    if elector is not None and elector.lost.is_set():
        log.error("Exiting: leadership was lost")
        return 1
    return 0


def _elector(args: argparse.Namespace) -> LeaderElector:
    """The Lease elector: the second client that writes to the API server besides the
    executor's."""
    from autoglm_operator.io import kube, leader

    return leader.LeaderElector(
        kube.Kube.from_environment(user_agent=f"{kube.USER_AGENT}/leader"),
        namespace=args.lease_namespace or _default_lease_namespace(args),
        identity=args.identity or f"{socket.gethostname()}-{os.getpid()}",
        name=args.lease_name,
        lease_seconds=args.lease_seconds,
        renew_seconds=args.lease_seconds / 3,
    )


def _lead(elector: LeaderElector, args: argparse.Namespace, stop: threading.Event) -> bool:
    """Wait for the Lease (answering liveness meanwhile); False when stopped first."""
    from autoglm_operator.io import leader

    if args.liveness:
        with leader.StandbyProbe(args.liveness):
            return elector.acquire(stop)
    return elector.acquire(stop)


def crd(args: argparse.Namespace) -> int:
    if args.reference:
        from autoglm_operator.resource.reference import render_reference_markdown

        sys.stdout.write(render_reference_markdown())
        return 0
    from autoglm_operator.resource.crd import render_crd_yaml

    sys.stdout.write(render_crd_yaml())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autoglm-operator", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    run_p = sub.add_parser("run", help="run the operator (kopf) with leader election")
    scope = run_p.add_mutually_exclusive_group(required=True)
    scope.add_argument("--namespace", "-n", action="append", help="watch this namespace (repeat)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    run_p.add_argument("--liveness", help="health endpoint, e.g. http://0.0.0.0:8080/healthz")
    run_p.add_argument(
        "--leader-election",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hold a Lease before running, so replicas never fight (default: on)",
    )
    run_p.add_argument("--lease-name", default="autoglm-operator")
    run_p.add_argument("--lease-namespace", help="default: the pod's own, else the first watched")
    run_p.add_argument("--lease-seconds", type=int, default=30)
    run_p.add_argument("--identity", help="this replica's name in the Lease (default: host-pid)")
    run_p.add_argument("--verbose", "-v", action="store_true")
    run_p.set_defaults(func=run)

    crd_p = sub.add_parser("crd", help="print the CustomResourceDefinition YAML")
    crd_p.add_argument(
        "--reference", action="store_true", help="print the resource reference (Markdown) instead"
    )
    crd_p.set_defaults(func=crd)

    for name in SUBCOMMAND_MODULES:
        module = _import_optional(name)
        add_parser = getattr(module, "add_parser", None)
        if add_parser is not None:
            add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    raise SystemExit(args.func(args))


if __name__ == "__main__":
    main()
