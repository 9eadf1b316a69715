"""`autoglm-runtime`: `serve` runs vLLM with the mode middleware, `sim` runs the CPU engine."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence

from autoglm_runtime.config import ConfigError, RuntimeSettings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autoglm-runtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve",
        help="run `vllm serve` with the mode middleware",
        description="Run `vllm serve`. Args after `--` go to vLLM verbatim; without them the "
        "argv is built from AUTOGLM_* env and the config file.",
    )
    serve.add_argument("--dry-run", action="store_true", help="print the command and exit")

    sim = sub.add_parser("sim", help="run the CPU engine (same API and metrics as vLLM)")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=8000)
    sim.add_argument("--admin-port", type=int, default=None,
                     help="the admin API's port (default: AUTOGLM_ADMIN_PORT, else 8001)")
    sim.add_argument("--time-factor", type=float, default=1.0,
                     help="multiply every simulated duration (0.1 runs 10x faster)")
    sim.add_argument("--model-load-seconds", type=float, default=0.0,
                     help="simulated load time; /health is 503 until it passes")
    sim.add_argument("--max-num-seqs", type=int, default=None,
                     help="engine sequence limit (default: the profiles' envelope)")
    sim.add_argument("--calibration", choices=("gpu", "cpu"), default="gpu",
                     help="latency model: the reference GPU deployment (default) or the engine "
                     "tier's tiny model on the CPU (bench/sim_fidelity.py)")
    sim.add_argument("--max-num-batched-tokens", type=int, default=2048)
    sim.add_argument("--kv-cache-tokens", type=int, default=65536)
    sim.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                     default=True, help="reuse cached prompt blocks, as vLLM's flag (default on)")
    sim.add_argument("--no-middleware", action="store_true",
                     help="serve without the mode middleware (for overhead benchmarks)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in args_in:
        split = args_in.index("--")
        args_in, passthrough = args_in[:split], args_in[split + 1 :]
    args = _parser().parse_args(args_in)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = RuntimeSettings()
    try:
        if args.command == "serve":
            return _serve(settings, passthrough, args.dry_run)
        return _sim(settings, args)
    except ConfigError as exc:
        print(f"autoglm-runtime: configuration error: {exc}", file=sys.stderr)
        return 2


def _serve(settings: RuntimeSettings, passthrough: list[str], dry_run: bool) -> int:
    from autoglm_runtime.launcher import VLLMNotInstalled, serve, serve_argv

    if dry_run:
        print(json.dumps(["vllm", "serve", *serve_argv(settings, passthrough)]))
        return 0
    try:
        return serve(settings, passthrough)
    except VLLMNotInstalled as exc:
        print(f"autoglm-runtime: {exc}", file=sys.stderr)
        return 127


def _sim(settings: RuntimeSettings, args: argparse.Namespace) -> int:
    from autoglm_runtime.sim.app import SimSettings
    from autoglm_runtime.sim.model import CALIBRATIONS
    from autoglm_runtime.sim.server import serve_sim

    sim_settings = SimSettings(
        time_factor=args.time_factor,
        model_load_seconds=args.model_load_seconds,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_tokens=args.kv_cache_tokens,
        enable_prefix_caching=args.enable_prefix_caching,
        with_middleware=not args.no_middleware,
        runtime=settings,
        latency=CALIBRATIONS[args.calibration],
    )
    asyncio.run(serve_sim(args.host, args.port, sim_settings, args.admin_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
