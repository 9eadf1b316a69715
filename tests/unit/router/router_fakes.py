"""An in-memory stand-in for autoglm_router.discovery.Discovery: a list of endpoints the test
sets, and reports and start/stop that do nothing. Override only what a test needs."""

from __future__ import annotations

from autoglm_router.discovery import Endpoint


class FixedDiscovery:
    """Discovery with a list the test sets or edits (`listed`); it scrapes nothing."""

    def __init__(self, *endpoints: Endpoint) -> None:
        self.listed = list(endpoints)

    def endpoints(self) -> list[Endpoint]:
        return self.listed

    def report_unreachable(self, name: str) -> None:
        pass

    def report_draining(self, name: str) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass
