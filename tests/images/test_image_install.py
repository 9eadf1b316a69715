"""The Dockerfiles' install steps, run as written in clean venvs (no Docker engine here).

Each image's build context (its COPY lines) is laid out in a temporary root, the `pip install`
commands of its RUN lines run in a fresh venv with the same package arguments (the pip cache
stays on, so a warm cache keeps this quick), and then the image's entrypoint and the commands
the operator and the chart run are checked in what was installed. The runtime image installs
into vLLM's own image, so here it gets the runtime package without vLLM.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from autoglm_api.engine_args import MIDDLEWARE_IMPORT_PATH
from autoglm_operator.reconcile.children import router as router_builders
from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from testkit.dockerfiles import instructions

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
CRD_FILE = REPO / "crds" / "autoglm.io_autoglmdeployments.yaml"
# pip flags in the RUN lines: those taking a value, and those that only matter in an image
# (--system: uv's "install into the image's Python"; --no-cache: keep the layer small). The
# constraints file is vLLM's own freeze, which exists only in the base image.
FLAGS_WITH_VALUE = {"--constraint", "-c"}
IMAGE_ONLY_FLAGS = {"--system", "--no-cache", "--no-cache-dir"}



def _lay_out_context(dockerfile: Path, root: Path) -> Path:
    """Copy what the COPY lines take from the repository to their place under `root`; return
    the final WORKDIR of the build stage (where relative paths in RUN lines point)."""
    workdir = Path("/")
    for keyword, rest in instructions(dockerfile):
        if keyword == "WORKDIR":
            workdir = workdir / rest
        elif keyword == "RUN":
            break
        elif keyword == "COPY" and "--from=" not in rest:
            *sources, dest = shlex.split(rest)
            target = root / (workdir / dest).relative_to("/")
            for source in sources:
                src = REPO / source
                if src.is_dir():
                    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
                    shutil.copytree(src, target, dirs_exist_ok=True, ignore=skip)
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, target / src.name)
    return root / workdir.relative_to("/")


def _commands(dockerfile: Path) -> list[list[str]]:
    """The first build stage's RUN lines, split into commands (on &&, ; and newlines)."""
    commands = []
    for keyword, rest in instructions(dockerfile):
        if keyword == "FROM" and commands:
            break
        if keyword == "RUN":
            script = rest.removeprefix("set -eux;").strip()
            for part in re.split(r"&&|;", script):
                if part.strip():
                    commands.append(shlex.split(part, posix=True))
    return commands


def pip_install_packages(dockerfile: Path) -> list[list[str]]:
    """For each `pip install` in the RUN lines, the package arguments it installs."""
    installs = []
    for argv in _commands(dockerfile):
        if "pip" not in [Path(a).name for a in argv] or "install" not in argv:
            continue
        args = argv[argv.index("install") + 1 :]
        packages, skip_next = [], False
        for arg in args:
            if skip_next:
                skip_next = False
            elif arg in FLAGS_WITH_VALUE:
                skip_next = True
            elif arg.startswith("-"):
                assert arg in IMAGE_ONLY_FLAGS, (
                    f"{dockerfile.name}: pip flag {arg} is new to this test: say here whether "
                    "it changes what is installed"
                )
            else:
                packages.append(arg)
        installs.append(packages)
    return installs


def _install(dockerfile: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Lay out the context, create a clean venv, run the image's pip installs in it."""
    root = tmp_path / "root"
    workdir = _lay_out_context(dockerfile, root)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    installs = pip_install_packages(dockerfile)
    assert installs, f"{dockerfile.name} installs nothing with pip"
    for packages in installs:
        local = []
        for package in packages:
            path, extra = re.fullmatch(r"([^\[]+)(\[.*\])?", package).groups()  # type: ignore[union-attr]
            # An image path (absolute, or relative to WORKDIR) maps into the laid-out root.
            place = root / path.lstrip("/") if path.startswith("/") else workdir / path
            assert place.is_dir(), f"{dockerfile.name} installs {path}, which no COPY provides"
            local.append(f"{place}{extra or ''}")
        subprocess.run(
            [env_dir / "bin" / "python", "-m", "pip", "install", "--quiet",
             "--disable-pip-version-check", *local],
            check=True, timeout=840,
        )  # fmt: skip
    return env_dir, root


def _entrypoint_and_cmd(dockerfile: Path) -> tuple[list[str], list[str]]:
    last = {k: rest for k, rest in instructions(dockerfile) if k in ("ENTRYPOINT", "CMD")}
    return json.loads(last["ENTRYPOINT"]), json.loads(last.get("CMD", "[]"))


def _run(env_dir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    path = f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "VIRTUAL_ENV": str(env_dir)}
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        list(argv), capture_output=True, text=True, env=env, cwd="/", timeout=120, check=False
    )


def _assert_carries_only(env_dir: Path, packages: set[str]) -> None:
    """Each image installs its own process's package and the shared contract, nothing else."""
    names = ("autoglm_api", "autoglm_operator", "autoglm_runtime", "autoglm_router", "testkit")
    script = f"import importlib.util as u; print([n for n in {names!r} if u.find_spec(n)])"
    result = _run(env_dir, "python", "-c", script)
    assert result.returncode == 0, result.stderr
    assert set(json.loads(result.stdout.replace("'", '"'))) == packages


def test_operator_image_install_runs_the_operator(tmp_path: Path) -> None:
    dockerfile = IMAGES / "operator.Dockerfile"
    env_dir, _root = _install(dockerfile, tmp_path)
    _assert_carries_only(env_dir, {"autoglm_api", "autoglm_operator"})
    entrypoint, cmd = _entrypoint_and_cmd(dockerfile)
    assert (env_dir / "bin" / entrypoint[0]).is_file(), f"{entrypoint[0]} was not installed"
    # The image's default command and the CRD parse and print with the installed code alone.
    check = "import sys, autoglm_operator.cli as c; c.build_parser().parse_args(sys.argv[1:])"
    result = _run(env_dir, "python", "-c", check, *entrypoint[1:], *cmd)
    assert result.returncode == 0, result.stderr
    result = _run(env_dir, *entrypoint, "crd")
    assert result.returncode == 0, result.stderr
    assert result.stdout == CRD_FILE.read_text()
    # `run` imports these (kopf, the Kubernetes client, the Prometheus client) before anything.
    modules = (
        "autoglm_operator.handlers.reconcile, autoglm_operator.handlers.adaptive_pass, "
        "autoglm_operator.io.kube"
    )
    result = _run(env_dir, "python", "-c", f"import {modules}")
    assert result.returncode == 0, result.stderr


def test_runtime_image_install_runs_what_the_operator_starts(tmp_path: Path) -> None:
    dockerfile = IMAGES / "runtime.Dockerfile"
    env_dir, _root = _install(dockerfile, tmp_path)
    _assert_carries_only(env_dir, {"autoglm_api", "autoglm_runtime"})
    entrypoint, cmd = _entrypoint_and_cmd(dockerfile)
    assert (env_dir / "bin" / entrypoint[0]).is_file(), f"{entrypoint[0]} was not installed"
    result = _run(env_dir, "python", "-c", "import importlib.util as u; print(u.find_spec('vllm'))")
    assert result.stdout.strip() == "None", "vLLM comes from the base image, not from [runtime]"
    # The serving pod's command, with the argv the operator builds, resolves to `vllm serve`.
    container = builders.pod_template("phone", AutoGLMDeploymentSpec())["spec"]["containers"][0]
    assert container["command"][: len(entrypoint)] == entrypoint
    assert container["command"][len(entrypoint)] == cmd[0]
    command = [*container["command"][:-1], "--dry-run", "--", *container["args"]]
    result = _run(env_dir, *command)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[:3] == ["vllm", "serve", container["args"][0]]
    # What `vllm serve --middleware` imports, and the preStop hook's interpreter.
    module, _, name = MIDDLEWARE_IMPORT_PATH.rpartition(".")
    assert MIDDLEWARE_IMPORT_PATH in container["args"]
    result = _run(env_dir, "python", "-c", f"from {module} import {name}")
    assert result.returncode == 0, result.stderr
    prestop = container["lifecycle"]["preStop"]["exec"]["command"]
    result = _run(env_dir, *prestop[:2], "import urllib.request, pathlib")
    assert result.returncode == 0, result.stderr


def test_router_image_install_runs_what_the_operator_starts(tmp_path: Path) -> None:
    dockerfile = IMAGES / "router.Dockerfile"
    env_dir, _root = _install(dockerfile, tmp_path)
    _assert_carries_only(env_dir, {"autoglm_api", "autoglm_router"})
    entrypoint, _cmd = _entrypoint_and_cmd(dockerfile)
    assert (env_dir / "bin" / entrypoint[0]).is_file(), f"{entrypoint[0]} was not installed"
    # CPU only and small: neither vLLM, torch, the operator nor a Kubernetes client.
    for module in ("vllm", "torch", "kopf", "kubernetes", "autoglm_operator", "fastapi"):
        found = _run(env_dir, "python", "-c", f"import importlib.util as u; "
                     f"print(u.find_spec('{module}'))")  # fmt: skip
        assert found.stdout.strip() == "None", f"{module} is in the router image"
    # The router pod's command and args, as the operator builds them, parse and reach the
    # point where they look for the pod's ServiceAccount (there is none here).
    owner = builders.Owner("phone", "serving", "u")
    pod = router_builders.pod_template(owner, AutoGLMDeploymentSpec())["spec"]
    container = pod["containers"][0]
    assert container["command"] == entrypoint
    outside = ("env", "-u", "KUBECONFIG", "-u", "KUBERNETES_SERVICE_HOST")  # as here, no pod
    result = _run(env_dir, *outside, *container["command"], *container["args"])
    assert result.returncode == 2, result.stderr
    assert "not inside a pod and no kubeconfig" in result.stderr, result.stderr
    # The preStop hook's command exists in a slim Debian image as it does here.
    assert shutil.which(container["lifecycle"]["preStop"]["exec"]["command"][0])


def test_pip_steps_are_found_in_every_dockerfile() -> None:
    """The extraction the tests above rely on: each image installs the package once."""
    assert pip_install_packages(IMAGES / "operator.Dockerfile") == [[".[operator]"]]
    assert pip_install_packages(IMAGES / "runtime.Dockerfile") == [["/tmp/autoglm[runtime]"]]
    assert pip_install_packages(IMAGES / "router.Dockerfile") == [[".[router]"]]
    assert sys.version_info >= (3, 11)
