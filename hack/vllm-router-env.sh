#!/usr/bin/env bash
# vLLM's own Rust router (`vllm-router` from PyPI), for bench/router_sessions.py to compare
# against: built once into its own venv under the cache, keyed by version, never into .venv.
# A marker written last makes it idempotent. Prints the `vllm-router` binary's path as its last
# line on stdout; progress goes to stderr.
set -euo pipefail

version=${VLLM_ROUTER_VERSION:-0.1.17}
python=${PYTHON:-python3}
cache=${AUTOGLM_CACHE:-$HOME/.cache/autoglm}
venv=$cache/vllm-router-$version
marker=$venv/.complete

if [ ! -f "$marker" ]; then
  printf '[vllm-router-env] installing vllm-router==%s into %s\n' "$version" "$venv" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet "vllm-router==$version" >&2
  touch "$marker"
fi
for candidate in "$venv/bin/vllm-router" "$venv/bin/vllm_router"; do
  if [ -x "$candidate" ]; then
    echo "$candidate"
    exit 0
  fi
done
printf '[vllm-router-env] no vllm-router executable in %s/bin\n' "$venv" >&2
exit 1
