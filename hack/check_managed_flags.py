"""Check the extraArgs refusals against the real `vllm serve` parser of an installed vLLM.

Every prefix of every option string the parser knows, with `-` or `_`, bare, `=1` or `.k`: vLLM
reads it as a managed setting (or as --api-key) exactly when refused_extra_arg (or
API_KEY_FLAG_PATTERN) refuses it. A prefix vLLM finds ambiguous is refused by vLLM itself, so it
may go either way. Needs vLLM importable (it is not a project dependency):

    VLLM_TARGET_DEVICE=cpu <python with vllm> hack/check_managed_flags.py
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from autoglm_runtime.engine_args import (
    API_KEY_FLAG_PATTERN,
    MANAGED_SPELLINGS,
    refused_extra_arg,
)

AMBIGUOUS = "<ambiguous>"


def serve_parser() -> Any:
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def destination(parser: Any, name: str) -> str | None:
    """The dest argparse binds this (dash-spelled) flag name to, abbreviations included."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            found = parser._parse_optional(name)
    except SystemExit:  # argparse's error(): an ambiguous abbreviation
        return AMBIGUOUS
    if not found:
        return None
    found = found[0] if isinstance(found, list) else found
    return found[0].dest if found[0] is not None else None


def spellings(name: str) -> set[str]:
    """The arg forms vLLM reads as this flag name: `_` for `-`, `=value`, `.key`."""
    names = {name}
    if name.startswith("--"):
        names.add("--" + name[2:].replace("-", "_"))
    return {n + suffix for n in names for suffix in ("", "=1", ".k")}


def refused(arg: str) -> bool:
    """Refused as a managed flag or as --api-key (not as --config, a flag of its own)."""
    why = refused_extra_arg(arg)
    as_managed = why is not None and "--config" not in why
    return as_managed or re.fullmatch(API_KEY_FLAG_PATTERN, arg) is not None


def main() -> int:
    parser = serve_parser()
    options = parser._option_string_actions
    guarded = {options[flag].dest for flag in MANAGED_SPELLINGS} | {"api_key"}
    names = {option[:n] for option in options for n in range(2, len(option) + 1)}
    wrong, checked = [], 0
    for name in sorted(names):
        dest = destination(parser, name)
        for arg in spellings(name):
            checked += 1
            if dest != AMBIGUOUS and refused(arg) != (dest in guarded):
                wrong.append(f"{arg}: vLLM sets {dest}, refused: {refused(arg)}")
    print(f"{checked} args ({len(names)} prefixes of {len(options)} option strings) checked")
    print("\n".join(wrong) or "every arg vLLM reads as a managed flag or --api-key is refused")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
