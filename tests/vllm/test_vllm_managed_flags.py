"""extraArgs refusals against the real `vllm serve` parser: a spelling is refused exactly when
vLLM would read it as a flag the operator manages (or as --api-key).

Every prefix of every option string the parser knows, with `-` or `_`, bare, `=1` or `.k`. A
prefix vLLM finds ambiguous is refused by vLLM itself at start-up, so it may go either way.
"""

from __future__ import annotations

import contextlib
import io
import re
from typing import Any

from vllm_kit import serve_parser

from autoglm_api.engine_args import API_KEY_FLAG_PATTERN, MANAGED_SPELLINGS, refused_extra_arg

AMBIGUOUS = "<ambiguous>"


def _destination(parser: Any, name: str) -> str | None:
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


def _spellings(name: str) -> set[str]:
    """The arg forms vLLM reads as this flag name: `_` for `-`, `=value`, `.key`."""
    names = {name}
    if name.startswith("--"):
        names.add("--" + name[2:].replace("-", "_"))
    return {n + suffix for n in names for suffix in ("", "=1", ".k")}


def _refused(arg: str) -> bool:
    """Refused as a managed flag or as --api-key (not as --config, a flag of its own)."""
    why = refused_extra_arg(arg)
    as_managed = why is not None and "--config" not in why
    return as_managed or re.fullmatch(API_KEY_FLAG_PATTERN, arg) is not None


def test_every_spelling_vllm_reads_as_a_managed_flag_is_refused_and_no_other() -> None:
    parser = serve_parser()
    options = parser._option_string_actions
    guarded = {options[flag].dest for flag in MANAGED_SPELLINGS} | {"api_key"}
    names = {option[:n] for option in options for n in range(2, len(option) + 1)}
    wrong, checked = [], 0
    for name in sorted(names):
        dest = _destination(parser, name)
        for arg in _spellings(name):
            checked += 1
            if dest != AMBIGUOUS and _refused(arg) != (dest in guarded):
                wrong.append(f"{arg}: vLLM sets {dest}, refused: {_refused(arg)}")
    assert checked > 10_000, checked  # the parser was really read
    assert wrong == []
