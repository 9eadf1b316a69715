"""`autoglm-router` refuses bad flags at start, with a message that names the flag."""

from __future__ import annotations

import pytest

from autoglm_router.cli import build_parser, create_app, main
from autoglm_runtime.profiles import Mode


@pytest.mark.parametrize(("argv", "message"), [
    ([], "--endpoint"),
    (["--endpoint", "10.0.0.7:8000"], "not a replica base URL"),
    (["--endpoint", "http://a:8000/v1"], "not a replica base URL"),
    (["--endpoint", "http://a:8000", "--load-factor", "0.9"], "--load-factor must be at least"),
    (["--endpoint", "http://a:8000", "--streaming-cap", "0"], "must be above 0"),
    (["--endpoint", "http://a:8000", "--endpoint", "http://a:8000/"], "once"),
])
def test_bad_flags_are_refused(argv: list[str], message: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_flags_reach_the_routing_config_and_proxy() -> None:
    args = build_parser().parse_args([
        "--endpoint", "http://a:8000/", "--load-factor", "2", "--no-spill",
        "--streaming-cap", "4", "--max-body-bytes", "4096", "--prefix-chars", "64"])
    app = create_app(args)
    assert app.config.load_factor == 2.0 and not app.config.spill
    assert app.config.caps[Mode.STREAMING] == 4 and app.config.caps[Mode.BATCHING] == 64
    assert app.settings.max_body_bytes == 4096 and app.settings.prefix_chars == 64
    assert [e.name for e in app.discovery.endpoints()] == ["http://a:8000"]
