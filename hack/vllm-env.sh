#!/usr/bin/env bash
# The conformance tier's Python environment, built once into a cache keyed by version:
#   the pinned vLLM (PINNED_VLLM_VERSION in runtime/autoglm_runtime/engine_args.py, the one
#   place for it) with everything its wheel asks for, then the dependencies of the project's
#   runtime and operator extras, pytest and the test clients, constrained to the versions vLLM
#   installed so none of its pins moves. The project itself is not installed: pytest puts
#   operator/, runtime/ and the test harness testkit/ on sys.path (pyproject's pythonpath), so
#   one cached environment serves every checkout.
# A marker written last makes it idempotent; without the marker (an interrupted install) the
# environment is rebuilt from scratch. Prints the venv directory on stdout as its last line;
# progress goes to stderr.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
python=${PYTHON:-python3}

log() { printf '[vllm-env] %s\n' "$*" >&2; }

version=$(sed -n 's/^PINNED_VLLM_VERSION = "\([^"]*\)"$/\1/p' \
  "$repo/runtime/autoglm_runtime/engine_args.py")
if [ -z "$version" ]; then
  log "cannot read PINNED_VLLM_VERSION from runtime/autoglm_runtime/engine_args.py"
  exit 1
fi
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
cache=${AUTOGLM_CACHE:-$HOME/.cache/autoglm}
venv=$cache/vllm-$version-py$pyver
marker=$venv/.complete

# The project's runtime and operator extras, read from pyproject so the two never disagree.
project_deps() {
  "$python" - "$repo/pyproject.toml" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
print("\n".join(sorted(set(extras["runtime"]) | set(extras["operator"]))))
EOF
}
TEST_DEPS=(pytest pytest-asyncio pytest-timeout httpx openai langchain-openai)

# What the environment is built from: a change to any of it rebuilds it.
stamp=$( { cat "${BASH_SOURCE[0]}"; project_deps; } | sha256sum | cut -d' ' -f1)

mkdir -p "$cache"
exec 9>"$cache/vllm-$version-py$pyver.lock"
flock 9  # a second run waits for the first instead of installing over it

if [ -f "$marker" ] && [ "$(cat "$marker")" = "$stamp" ]; then
  echo "$venv"
  exit 0
fi

started=$SECONDS
log "building $venv (vllm==$version; cold: ~10 minutes and ~10 GB, most of it torch's CUDA wheels) ..."
rm -rf "$venv"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install --progress-bar off --upgrade pip >&2
log "installing vllm==$version ..."
"${pip[@]}" install --progress-bar off "vllm==$version" >&2
log "installed vllm in $((SECONDS - started))s; adding the project's dependencies and pytest ..."
constraints=$venv/vllm-constraints.txt
"${pip[@]}" freeze --exclude-editable >"$constraints"
mapfile -t deps < <(project_deps)
# The constraints make pip fail rather than move a version vLLM installed.
"${pip[@]}" install --progress-bar off -c "$constraints" "${deps[@]}" "${TEST_DEPS[@]}" >&2
"$venv/bin/python" -c "import vllm, importlib.metadata as m; assert m.version('vllm') == '$version'"
echo "$stamp" >"$marker"
log "ready in $((SECONDS - started))s: $(du -sh "$venv" | cut -f1) in $venv"
echo "$venv"
