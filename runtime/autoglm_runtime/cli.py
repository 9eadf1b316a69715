"""`autoglm-runtime serve`: run vLLM with the mode middleware. The CPU sim that serves the same
API is the harness's (`python -m testkit.sim`), never in the runtime image."""

from __future__ import annotations

import argparse
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
        return _serve(settings, passthrough, args.dry_run)
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


if __name__ == "__main__":
    sys.exit(main())
