#!/usr/bin/env bash
# The conformance tier's Python environment, built once into a cache keyed by version:
#   the pinned vLLM (PINNED_VLLM_VERSION in runtime/autoglm_runtime/engine_args.py, the one
#   place for it) with everything its wheel asks for, then the dependencies of the project's
#   runtime and operator extras, pytest and the test clients, constrained to the versions vLLM
#   installed so none of its pins moves (hack/lib/engine-env.sh: the cache, the marker, the
#   project's dependencies). Prints the venv directory on stdout as its last line; progress goes
#   to stderr.
set -euo pipefail

name=vllm-env
source "$(dirname "${BASH_SOURCE[0]}")/lib/engine-env.sh"

version=$(sed -n 's/^PINNED_VLLM_VERSION = "\([^"]*\)"$/\1/p' \
  "$repo/runtime/autoglm_runtime/engine_args.py")
if [ -z "$version" ]; then
  log "cannot read PINNED_VLLM_VERSION from runtime/autoglm_runtime/engine_args.py"
  exit 1
fi
venv=$cache/vllm-$version-py$pyver

engine_env_begin "vllm==$version; cold: ~10 minutes and ~10 GB, most of it torch's CUDA wheels"
log "installing vllm==$version ..."
"${pip[@]}" install --progress-bar off "vllm==$version" >&2
log "installed vllm in $((SECONDS - started))s; adding the project's dependencies and pytest ..."
constraints=$venv/vllm-constraints.txt
"${pip[@]}" freeze --exclude-editable >"$constraints"
mapfile -t deps < <(project_deps)
# The constraints make pip fail rather than move a version vLLM installed.
"${pip[@]}" install --progress-bar off -c "$constraints" "${deps[@]}" "${TEST_DEPS[@]}" >&2
"$venv/bin/python" -c "import vllm, importlib.metadata as m; assert m.version('vllm') == '$version'"
engine_env_done
