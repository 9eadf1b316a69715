"""`python -m testkit.sim`: run the CPU engine, with vLLM's OpenAI API and metrics and the mode
middleware, for tests, benchmarks and the demo (docs/runtime/sim.md)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
from collections.abc import Sequence

from autoglm_runtime.config import ConfigError, RuntimeSettings
from testkit.sim.model import CALIBRATIONS, SleepModel
from testkit.sim.settings import SimSettings

PROG = "python -m testkit.sim"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="run the CPU engine (same API and metrics as vLLM)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--admin-port", type=int, default=None,
                        help="the admin API's port (default: AUTOGLM_ADMIN_PORT, else 8001)")
    parser.add_argument("--time-factor", type=float, default=1.0,
                        help="multiply every simulated duration (0.1 runs 10x faster)")
    parser.add_argument("--model-load-seconds", type=float, default=0.0,
                        help="simulated load time; /health is 503 until it passes")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="engine sequence limit (default: the profiles' envelope)")
    parser.add_argument("--calibration", choices=("gpu", "cpu"), default="gpu",
                        help="latency model: the reference GPU deployment (default) or the "
                        "engine tier's tiny model on the CPU (bench/sim_fidelity.py)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--kv-cache-tokens", type=int, default=65536)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="reuse cached prompt blocks, as vLLM's flag (default on)")
    parser.add_argument("--no-middleware", action="store_true",
                        help="serve without the mode middleware (for overhead benchmarks)")
    sleep = SleepModel()
    parser.add_argument("--enable-sleep-mode", action="store_true",
                        help="let the engine sleep and wake, as vLLM's flag (default off; GPU "
                        "calibration only: vLLM has no sleep mode on the CPU)")
    parser.add_argument("--sleep-seconds", type=float, default=sleep.sleep_seconds,
                        help="simulated level-1 sleep (default: the 9B model's, from vLLM's "
                        "published figures; docs/runtime/sim.md)")
    parser.add_argument("--wake-seconds", type=float, default=sleep.wake_seconds,
                        help="simulated level-1 wake (a level-2 wake reloads the weights too)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.enable_sleep_mode and args.calibration == "cpu":
        # As vLLM 0.32 refuses the flag on the CPU platform (config/model.py).
        parser.error("--enable-sleep-mode: sleep mode is not supported on the CPU "
                     "(--calibration cpu), as in vLLM")
    if min(args.sleep_seconds, args.wake_seconds) < 0:
        parser.error("--sleep-seconds and --wake-seconds must be 0 or more")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = RuntimeSettings()
    try:
        return _sim(settings, args)
    except ConfigError as exc:
        print(f"{PROG}: configuration error: {exc}", file=sys.stderr)
        return 2


def _sim(settings: RuntimeSettings, args: argparse.Namespace) -> int:
    from testkit.sim.server import serve_sim  # looked up at call time: tests replace it

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
        enable_sleep_mode=args.enable_sleep_mode,
        sleep=dataclasses.replace(SleepModel(), sleep_seconds=args.sleep_seconds,
                                  wake_seconds=args.wake_seconds),
    )
    asyncio.run(serve_sim(args.host, args.port, sim_settings, args.admin_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
