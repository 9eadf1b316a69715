"""ModeMiddleware: the live mode of a replica, as pure ASGI inside vLLM's own API server.

vLLM 0.32 loads it with `app.add_middleware(ModeMiddleware)` (no arguments), so it configures
itself from the environment when no settings are passed. It adds no network hop: admission,
priority, the batch window and SSE coalescing all happen in the server's event loop. The admin
API is not served here: the launcher serves it on its own port and relays each call to the
socket this middleware listens on while the app runs (admin.py).

It also puts the engine to sleep and wakes it (vLLM's sleep mode; autoglm_api.standby): a
relayed sleep, taken only while nothing is admitted or queued, calls the engine client's
`sleep(level, mode="wait")`, so even a request the middleware did not count finishes rather
than being aborted; a request that reaches a sleeping replica is admitted as usual and, before
it reaches the engine, waits for one wake, shared by every request that arrives meanwhile, in
the order vLLM's sleep-mode docs give. No request is refused because the replica slept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any, Protocol

from prometheus_client import REGISTRY, CollectorRegistry

from autoglm_api.api_key import UNAUTHORIZED_BODY, is_guarded, key_digests, presents_a_key
from autoglm_api.asgi_body import BodyTooLarge, ClientDisconnected, read_body
from autoglm_api.engine_args import EngineSettings
from autoglm_api.profiles import Mode
from autoglm_api.traffic import TRAFFIC_CLASS_HEADER
from autoglm_runtime.admin import SLEEP_LEVELS, CallRefused, State, serve_relay
from autoglm_runtime.admission import AdmissionController, Rejected, Ticket
from autoglm_runtime.config import RuntimeConfig, RuntimeSettings, load_runtime_config
from autoglm_runtime.metrics import nvml_source, runtime_metrics
from autoglm_runtime.requests import (
    SESSION_HEADER,
    VLLM_PRIORITY_HEADER,
    VLLM_SESSION_HEADER,
    PreparedRequest,
    RequestError,
    RequestRules,
    SessionHeaders,
    error_body,
    explain_full_context,
    parse_json_object,
    prepare,
)
from autoglm_runtime.routes import ADMITTED_PATHS, refusal_for
from autoglm_runtime.sse import SSECoalescer

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("autoglm_runtime.middleware")

HEALTH_PATHS = frozenset({"/health", "/ping"})
# Every live middleware, so a process-level SIGTERM handler (the sim's) can drain them.
_instances: weakref.WeakSet[ModeMiddleware] = weakref.WeakSet()
NO_SLEEP_MODE = (
    "The engine was started without sleep mode (engine.enableSleepMode, vLLM's "
    "--enable-sleep-mode), so it cannot sleep. vLLM 0.32 has sleep mode on CUDA, ROCm and XPU "
    "only: on the CPU it refuses the flag."
)


# vLLM's pause mode for a sleep (PauseMode, vllm/v1/engine/__init__.py): "wait" lets the
# requests the engine runs finish first; its default, "abort", ends them.
SLEEP_PAUSE_MODE = "wait"


class EngineClient(Protocol):
    """What the middleware calls on vLLM's EngineClient (vllm/engine/protocol.py), which vLLM's
    routes reach as `request.app.state.engine_client`; the sim's engine has the same."""

    model_config: Any  # its enable_sleep_mode says whether the engine can sleep

    async def sleep(self, level: int = 1, mode: str = "abort") -> None: ...

    async def wake_up(self, tags: list[str] | None = None) -> bool: ...

    async def collective_rpc(self, method: str) -> Any: ...


class ModeMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        settings: RuntimeSettings | None = None,
        *,
        config: RuntimeConfig | None = None,
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self.app = app
        self.settings = settings if settings is not None else RuntimeSettings()
        self.config = config if config is not None else load_runtime_config(self.settings)
        engine = self.config.engine or EngineSettings(model="")
        profiles = self.config.profiles
        self.rules = RequestRules(
            served_model_name=self.config.served_model_name,
            max_model_len=self.config.max_model_len,
            default_max_tokens=self.config.default_max_tokens,
            max_chars_per_token=self.config.max_chars_per_token,
            # The engine is told the same (engine_args.build_vllm_argv).
            images_per_prompt=engine.images_per_prompt,
            allowed_media_domains=engine.allowed_media_domains,
            max_sequences=min(profiles.streaming.max_concurrency,
                              profiles.batching.max_concurrency),
        )
        # Read once, as vLLM reads VLLM_API_KEY once when it builds its app.
        api_key = self.settings.vllm_api_key
        self.api_key_digests = key_digests([api_key.get_secret_value()] if api_key else [])
        self.mode = self.config.initial_mode
        self.since = datetime.now(UTC)
        self.switches = 0
        self.draining = False
        self.controller = AdmissionController(self.config.profiles.for_mode(self.mode),
                                              engine_max_seqs=self._engine_max_seqs())
        self._relay: asyncio.AbstractServer | None = None
        # The Starlette app around the middleware, from the scopes it passes on: its state
        # holds vLLM's engine client once the server is up.
        self._app: Any = None
        self.sleeping = False  # from the start of a sleep until a wake has finished
        self._sleep_level = 1
        self._falling_asleep: asyncio.Task[None] | None = None
        self._waking: asyncio.Task[None] | None = None
        self.registry = registry
        self.metrics = runtime_metrics(registry)
        self.metrics.queued.set_function(lambda: self.controller.queued)
        self.metrics.inflight.set_function(lambda: self.controller.inflight)
        self.metrics.draining.set_function(lambda: int(self.draining))
        self.metrics.sleeping.set_function(lambda: int(self.sleeping))
        if self.config.gpu_metrics and self.metrics.gpu.source is None:
            self.metrics.gpu.source = nvml_source()
        self._set_mode_gauge()
        _instances.add(self)
        log.info("Started in %s mode", self.mode.value)

    # --- the mode -------------------------------------------------------------------------

    def _set_mode_gauge(self) -> None:
        for mode in Mode:
            self.metrics.mode.labels(mode.value).set(1 if mode is self.mode else 0)

    def switch(self, mode: Mode) -> bool:
        """Apply a mode now; admitted requests keep going, new ones follow the new profile."""
        if mode is self.mode:
            return False
        previous, self.mode = self.mode, mode
        self.controller.set_profile(self.config.profiles.for_mode(mode))
        self.since = datetime.now(UTC)
        self.switches += 1
        self.metrics.switches.inc()
        self._set_mode_gauge()
        log.info("Switched mode from %s to %s", previous.value, mode.value)
        return True

    def start_draining(self) -> None:
        if not self.draining:
            log.info("Started draining: %d in flight, %d queued",
                     self.controller.inflight, self.controller.queued)
        self.draining = True
        self.controller.start_draining()

    async def drain(self, grace_seconds: float) -> bool:
        """Refuse new work and wait for the admitted; True if all finished within the grace."""
        self.start_draining()
        return await self.controller.wait_idle(grace_seconds)

    def state(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "since": self.since.isoformat().replace("+00:00", "Z"),
            "switches": self.switches,
            "inflight": self.controller.inflight,
            "queued": self.controller.queued,
            "draining": self.draining,
            "sleeping": self.sleeping,
            "profile": self.controller.profile.model_dump(by_alias=True),
        }

    # --- sleep and wake (vLLM's sleep mode) -----------------------------------------------

    def engine_client(self) -> EngineClient | None:
        """vLLM's engine client, where its own routes find it; None before the server runs."""
        return getattr(getattr(self._app, "state", None), "engine_client", None)

    def start_sleep(self, level: int) -> None:
        """Put the engine to sleep in the background; CallRefused while it cannot sleep now."""
        engine = self.engine_client()
        if engine is None or not getattr(engine.model_config, "enable_sleep_mode", False):
            raise CallRefused(409, NO_SLEEP_MODE)
        if self.draining:
            raise CallRefused(409, "The replica is draining; it does not sleep.")
        if self._waking is not None:
            raise CallRefused(409, "The engine is waking; sleep after it is awake.", 1)
        if self.sleeping:
            return
        busy = self.controller.inflight + self.controller.queued
        if busy:
            # Whoever asked saw the replica idle, and it is not: its requests would wait out a
            # sleep and a wake. Once a sleep starts, new ones wait for the wake instead.
            raise CallRefused(409, f"{busy} requests are admitted or queued; the replica "
                                   "sleeps only when it is idle.", 1)
        self.sleeping = True
        self._sleep_level = level
        self._falling_asleep = asyncio.ensure_future(self._fall_asleep(engine, level))

    async def _fall_asleep(self, engine: EngineClient, level: int) -> None:
        try:
            await engine.sleep(level, mode=SLEEP_PAUSE_MODE)
        except Exception:
            # vLLM pauses its scheduler before it frees the GPU: a wake resumes it.
            log.exception("The engine did not go to sleep; waking it")
            self.wake()
            return
        self.metrics.sleeps.inc()
        log.info("Asleep (level %d)", level)

    def wake(self) -> asyncio.Task[None]:
        """The one wake of the sleeping engine, started by the first caller."""
        if self._waking is None:
            self._waking = asyncio.ensure_future(self._wake_up())
        return self._waking

    async def _wake_up(self) -> None:
        """Wake the engine; a failure is logged and leaves it asleep, for the next caller. No
        warm-up request follows: vLLM's sleep-mode docs ask for none (a sleep keeps the
        compiled kernels and CUDA graphs), and the requests that waited are served at once."""
        try:
            if self._falling_asleep is not None:
                await self._falling_asleep  # the engine takes its calls in order
            engine = self.engine_client()
            assert engine is not None  # it slept
            clock = asyncio.get_running_loop().time
            start = clock()
            if self._sleep_level == 2:
                awake = await _wake_from_level_2(engine)
            else:
                awake = await engine.wake_up()
            if not awake:
                raise RuntimeError("vLLM says part of the engine is still asleep")
            took = clock() - start
            self.metrics.wake_seconds.observe(took)
            self.sleeping = False
            self._falling_asleep = None
            log.info("Awake after %.2f s", took)
        except Exception:
            log.exception("The engine did not wake")
        finally:
            self._waking = None

    async def _awake(self, send: Send) -> bool:
        """Wait for the engine to wake; False (answered 503, to retry) when the wake failed."""
        await asyncio.shield(self.wake())
        if not self.sleeping:
            return True
        self.metrics.rejected.labels("wake_failed").inc()
        await _respond(send, 503, error_body("The engine did not wake; retry.", 503),
                       {"retry-after": "1"})
        return False

    # --- ASGI -----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            self._app = scope.get("app")  # Starlette's, in every scope (the lifespan's too)
        if scope["type"] == "lifespan" and self.settings.admin_socket is not None:
            await self.app(scope, self._stop_relay_on_shutdown(receive),
                           self._start_relay_on_startup(send))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]  # vLLM's --root-path: match on the app's own paths
        method = scope["method"]
        if self._refuses_the_key(method, path, scope):
            self.metrics.rejected.labels("unauthorized").inc()
            await _respond(send, 401, UNAUTHORIZED_BODY)  # vLLM's own 401, before admission
            return
        scope = _without_header(scope, VLLM_PRIORITY_HEADER.encode())
        refusal = refusal_for(path)
        if path in HEALTH_PATHS and self.draining:
            await _respond(send, 503, error_body("The replica is draining.", 503))
        elif refusal is not None:
            self.metrics.rejected.labels("not_served").inc()
            await _respond(send, 404, error_body(refusal.message(method, path), 404))
        elif method == "POST" and path in ADMITTED_PATHS:
            await self._admitted(scope, receive, send, path)
        else:
            await self.app(scope, receive, send)

    def _refuses_the_key(self, method: str, path: str, scope: Scope) -> bool:
        # A refused route outside vLLM's guarded prefixes (/tokenize) needs the key too: a
        # client without it learns nothing of what this server serves.
        if not self.api_key_digests or not (
                is_guarded(method, path) or refusal_for(path) is not None):
            return False
        return not presents_a_key(_header(scope, b"authorization"), self.api_key_digests)

    async def _admitted(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        if self.draining:
            self.metrics.rejected.labels("draining").inc()
            # Close the connection: a client's kept-alive connection to this pod outlives its
            # Service endpoint (kube-proxy keeps established connections), and its retry must
            # reconnect, through the Service to a ready replica, not come back here.
            await _respond(
                send, 503, error_body("The replica is draining; retry another replica.", 503),
                {"retry-after": "1"}, close=True,
            )
            return
        prepared = await self._prepare(scope, receive, send, path)
        if prepared is None:
            return  # refused, and answered
        self.metrics.received.labels(prepared.traffic_class.value).inc()
        body = json.dumps(prepared.body).encode()
        scope = _with_content_length(scope, len(body))
        # The body is read, so the next receive() only returns on disconnect: watch it.
        ticket = await self._admit(prepared.priority, receive, send, prepared.sequences)
        if ticket is None:
            return
        # The profile in force at admission shapes the response, even after a later switch.
        coalesce = self.controller.profile.stream_coalesce_chunks if prepared.stream else 1
        try:
            # Its ticket keeps the replica from sleeping again until it is answered.
            if self.sleeping and not await self._awake(send):
                return
            explained = _explain_full_context(send, self.config.max_model_len)
            await self.app(scope, _replay(body, receive),
                           _wrap_send(explained, prepared.session_id, coalesce))
        finally:
            self._release(ticket)

    def _engine_max_seqs(self) -> int:
        """The engine's sequence limit: what the launcher read in its argv, else the config's
        engine, else the profiles' envelope (what the operator sets)."""
        if self.settings.engine_max_num_seqs is not None:
            return self.settings.engine_max_num_seqs
        if self.config.engine is not None:
            return self.config.engine.max_num_seqs
        return self.config.profiles.envelope_max_num_seqs

    async def _prepare(
        self, scope: Scope, receive: Receive, send: Send, path: str
    ) -> PreparedRequest | None:
        """The checked and rewritten request; None when it was refused (and answered) or its
        client left before the whole body came."""
        sessions = SessionHeaders(
            vllm=_header(scope, VLLM_SESSION_HEADER.encode()),
            project=_header(scope, SESSION_HEADER.encode()),
        )
        limit = self.config.max_body_bytes
        try:
            declared = _header(scope, b"content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise BodyTooLarge(limit)  # refused before a byte of it is read
            raw = await read_body(receive, limit)
            return prepare(
                path, parse_json_object(bytes(raw)), self.rules,
                prioritize_streams=self.controller.profile.prioritize_streams,
                session_headers=sessions,
                declared_class=_header(scope, TRAFFIC_CLASS_HEADER.encode()),
            )
        except BodyTooLarge:
            self.metrics.rejected.labels("bad_request").inc()
            await _respond(send, 400, error_body(
                f"The request body is larger than {limit} bytes.", 400
            ), close=True)
        except ClientDisconnected:
            # Gone mid-body: nobody to answer, and the part that came is not a request.
            self.metrics.rejected.labels("client_gone").inc()
        except RequestError as exc:
            self.metrics.rejected.labels("bad_request").inc()
            await _respond(send, exc.status, error_body(exc.message, exc.status, exc.param))
        return None

    async def _admit(self, priority: int, watch: Receive, send: Send,
                     slots: int = 1) -> Ticket | None:
        """Slots for the request (one per sequence); None when it was refused (and answered)
        or its client left."""
        start = time.monotonic()
        try:
            ticket = await self._acquire(priority, watch, slots)
        except Rejected as exc:
            self.metrics.rejected.labels(exc.reason).inc()
            headers = {"retry-after": str(exc.retry_after)} if exc.retry_after else {}
            await _respond(send, exc.status, error_body(exc.message, exc.status), headers)
            return None
        if ticket is None:
            self.metrics.rejected.labels("client_gone").inc()
            return None  # the client left while queued: nobody to answer
        self.metrics.admitted.inc()
        self.metrics.queue_wait.observe(time.monotonic() - start)
        return ticket

    def _release(self, ticket: Ticket) -> None:
        self.controller.release(ticket)

    async def _acquire(self, priority: int, watch: Receive, slots: int = 1) -> Ticket | None:
        """Admission; while queued, a client that disconnects gives up its place (None)."""
        if self.controller.has_free_slot(priority, slots):
            return await self.controller.acquire(priority, slots)
        acquiring = asyncio.ensure_future(self.controller.acquire(priority, slots))
        watching = asyncio.ensure_future(watch())
        try:
            await asyncio.wait({acquiring, watching}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            watching.cancel()
            acquiring.cancel()
            with contextlib.suppress(BaseException):
                self.controller.release(await acquiring)
            raise
        gone = (watching.done() and watching.exception() is None
                and watching.result().get("type") == "http.disconnect")
        if not watching.done():
            watching.cancel()
        if not gone:
            return await acquiring
        acquiring.cancel()
        try:
            ticket = await acquiring
        except (asyncio.CancelledError, Rejected):
            return None
        self.controller.release(ticket)  # admitted in the same tick as the disconnect
        return None

    # --- the admin relay (admin.py) -------------------------------------------------------

    def relayed(self, call: State) -> State:
        """A call the launcher relays from the admin port (its token already checked)."""
        op = call.get("op")
        if op == "mode":
            self.switch(Mode(call["mode"]))
        elif op == "drain":
            self.start_draining()
        elif op == "sleep":
            level = call.get("level", 1)
            if isinstance(level, bool) or level not in SLEEP_LEVELS:
                raise ValueError(f"no sleep level {level!r}")
            self.start_sleep(level)
        elif op == "wake":
            if self.sleeping:
                self.wake()
        elif op != "state":
            raise ValueError(f"unknown op {op!r}")
        return self.state()

    def _start_relay_on_startup(self, send: Send) -> Send:
        # The relay listens while the app serves, so the launcher reaches the app's own state.
        async def wrapped(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete" and self._relay is None:
                path = self.settings.admin_socket
                assert path is not None
                try:
                    self._relay = await serve_relay(path, self.relayed)
                except OSError as exc:
                    log.error("The admin relay cannot listen on %s: %s", path, exc)
            await send(message)

        return wrapped

    def _stop_relay_on_shutdown(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown" and self._relay is not None:
                self._relay.close()
                self._relay = None
            return message

        return wrapped


async def _wake_from_level_2(engine: EngineClient) -> bool:
    """Level 2 dropped the weights: vLLM's documented wake (docs/features/sleep_mode.md,
    "Sleep level 2"; vllm/snapshot/server.py _restore_reloadable_state does the same), the KV
    cache last so the reload never competes with it for memory. True once fully awake."""
    # vllm/v1/engine/async_llm.py AsyncLLM.wake_up: map the weights' memory back, empty.
    await engine.wake_up(tags=["weights"])
    # vllm/v1/worker/gpu_worker.py Worker.reload_weights: load them in place from the model.
    await engine.collective_rpc("reload_weights")
    # vllm/v1/engine/core.py EngineCore.wake_up: the KV cache; the scheduler resumes when all is.
    return await engine.wake_up(tags=["kv_cache"])


async def drain_all(grace_seconds: float) -> bool:
    """Drain every middleware in this process (the sim's SIGTERM path)."""
    results = await asyncio.gather(*(m.drain(grace_seconds) for m in list(_instances)))
    return all(results)


def live_instances() -> list[ModeMiddleware]:
    return list(_instances)


# --- ASGI helpers -------------------------------------------------------------------------


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # later calls wait for the disconnect, as the app expects

    return replay


def _without_header(scope: Scope, name: bytes) -> Scope:
    """The scope without any header of this name, however the client spelled it."""
    headers = scope.get("headers", ())
    if not any(key.lower() == name for key, _ in headers):
        return scope
    return {**scope, "headers": [(k, v) for k, v in headers if k.lower() != name]}


def _with_content_length(scope: Scope, length: int) -> Scope:
    headers = [
        (k, v) for k, v in scope.get("headers", ())
        if k.lower() not in (b"content-length", b"transfer-encoding")
    ]
    headers.append((b"content-length", str(length).encode()))
    return {**scope, "headers": headers}


def _wrap_send(send: Send, session_id: str | None, coalesce: int) -> Send:
    if session_id is None and coalesce <= 1:
        return send
    coalescer: SSECoalescer | None = None

    async def wrapped(message: Message) -> None:
        nonlocal coalescer
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            if session_id is not None:
                headers.append((SESSION_HEADER.encode(), session_id.encode("latin-1", "replace")))
            content_type = next((v for k, v in headers if k.lower() == b"content-type"), b"")
            if coalesce > 1 and content_type.startswith(b"text/event-stream"):
                coalescer = SSECoalescer(coalesce)
            message = {**message, "headers": headers}
        elif message["type"] == "http.response.body" and coalescer is not None:
            more = message.get("more_body", False)
            out = coalescer.feed(message.get("body", b""))
            if not more:
                out += coalescer.finish()
            elif not out:
                return
            message = {**message, "body": out}
        await send(message)

    return wrapped


# An engine's error answer is a few hundred bytes; a larger 400 passes through as it is.
_MAX_EXPLAINED_BYTES = 64 * 1024


def _explain_full_context(send: Send, max_model_len: int) -> Send:
    """A 400 saying the prompt does not fit goes out with what to do about it (requests.py
    explain_full_context); every other answer unchanged."""
    held: list[Message] = []
    body = bytearray()

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start" and message.get("status") == 400:
            held.append(message)
            return
        if not held or message["type"] != "http.response.body":
            await send(message)
            return
        body.extend(message.get("body", b""))
        if message.get("more_body", False) and len(body) <= _MAX_EXPLAINED_BYTES:
            return
        start = held.pop()
        out = (None if message.get("more_body", False)
               else explain_full_context(bytes(body), max_model_len))
        if out is not None:
            kept = [(k, v) for k, v in start.get("headers", ()) if k.lower() != b"content-length"]
            start = {**start, "headers": [*kept, (b"content-length", str(len(out)).encode())]}
        await send(start)
        await send({**message, "body": out if out is not None else bytes(body)})
        body.clear()

    return wrapped


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    headers: dict[str, str] | None = None,
    close: bool = False,
) -> None:
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    if close:
        # No next request on this connection (an oversized body's unread rest, a drain).
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
