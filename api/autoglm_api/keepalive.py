"""How long our HTTP servers keep an idle connection open, and our clients reuse one.

A kept-alive HTTP/1.1 connection may be closed by the server whenever it is idle. A client that
took that connection from its pool just before the close reached it has sent a request that is
lost: it fails with a connection error, and clients do not retry it (it may have run). uvicorn,
and so `vllm serve`, closes an idle connection after 5 s; httpx, and so the official `openai`
client, stops reusing one after the same 5 s, counted from a later moment (when it has read the
response, not when the server sent it). So a request on a connection idle for just under 5 s
raced the server's close, and lost whenever the close came first.

The rule, kept by every server and client in this project:
- a server keeps an idle connection open longer than the clients that reach it reuse one
  (`SERVER_KEEP_ALIVE_SECONDS`), so they retire it first and the server never closes one
  under a request;
- a client of ours reuses an idle connection for less time than the server it talks to keeps one
  (`UPSTREAM_POOL_IDLE_SECONDS`, below a plain `vllm serve`'s 5 s too).
"""

from __future__ import annotations

# Above the idle reuse of the clients that reach a replica or a router: httpx and the openai
# client 5 s, aiohttp 15 s, nginx's upstream keepalive and cloud load balancers 60 s.
SERVER_KEEP_ALIVE_SECONDS = 75

# While a server drains, an idle connection closes this long after its last answer: past the
# openai client's 5 s and aiohttp's 15 s reuse, counted from when the client finished reading,
# which under load can be seconds after the server sent the last byte; and the drain is not held
# for the whole keep-alive.
DRAINING_IDLE_SECONDS = 20.0

# Below uvicorn's (and a plain `vllm serve`'s) stock 5 s, so also safe for replicas that do not
# run our launcher.
UPSTREAM_POOL_IDLE_SECONDS = 4.0

# The variable `vllm serve` reads for its uvicorn keep-alive (vllm/envs.py).
VLLM_KEEP_ALIVE_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
