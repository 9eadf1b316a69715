"""The Dockerfiles cannot be built here (no Docker engine), so what can be checked by reading is
checked against the code: pinned bases, the extras installed, entrypoints that exist, non-root
users that match what the chart and the operator run the pods as, and build contexts that
hold every file the COPY lines need."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
import yaml

from autoglm_api.engine_args import PINNED_VLLM_VERSION
from autoglm_operator import cli
from autoglm_operator.reconcile.children import router as router_builders
from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.resource import images
from autoglm_operator.resource.spec import (
    DEFAULT_IMAGE,
    DEFAULT_ROUTER_IMAGE,
    AutoGLMDeploymentSpec,
)
from testkit.chart import CHART, CHART_CRD, CRD_SOURCE, REPO, one, render
from testkit.dockerfiles import instructions

IMAGES = REPO / "images"
OPERATOR = IMAGES / "operator.Dockerfile"
RUNTIME = IMAGES / "runtime.Dockerfile"
ROUTER = IMAGES / "router.Dockerfile"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())



def _arg_default(dockerfile: Path, name: str) -> str:
    for keyword, rest in instructions(dockerfile):
        if keyword == "ARG" and rest.startswith(f"{name}="):
            return rest.split("=", 1)[1]
    raise AssertionError(f"{dockerfile.name} has no ARG {name}")


def _last(dockerfile: Path, keyword: str) -> str:
    values = [rest for k, rest in instructions(dockerfile) if k == keyword]
    assert values, f"{dockerfile.name} has no {keyword}"
    return values[-1]


def test_runtime_image_is_the_pinned_vllm_release() -> None:
    assert _arg_default(RUNTIME, "VLLM_IMAGE") == f"vllm/vllm-openai:v{PINNED_VLLM_VERSION}"
    froms = [rest for k, rest in instructions(RUNTIME) if k == "FROM"]
    assert froms == ["${VLLM_IMAGE}"]


@pytest.mark.parametrize("dockerfile", [OPERATOR, ROUTER])
def test_python_images_are_a_pinned_slim_python_the_package_supports(dockerfile: Path) -> None:
    image = _arg_default(dockerfile, "PYTHON_IMAGE")
    match = re.fullmatch(r"python:(3)\.(\d+)\.(\d+)-slim-(\w+)", image)
    assert match, f"{image}: pin major.minor.patch and a slim Debian release"
    minimum = re.fullmatch(r">=(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert minimum and (3, int(match.group(2))) >= (int(minimum.group(1)), int(minimum.group(2)))


@pytest.mark.parametrize(
    ("dockerfile", "extra"), [(OPERATOR, "operator"), (RUNTIME, "runtime"), (ROUTER, "router")]
)
def test_image_installs_the_package_with_its_extra(dockerfile: Path, extra: str) -> None:
    runs = " ".join(rest for k, rest in instructions(dockerfile) if k == "RUN")
    assert re.search(rf"install .*\[{extra}\]", runs), (
        f"{dockerfile.name} does not install [{extra}]"
    )
    assert extra in PYPROJECT["project"]["optional-dependencies"]


@pytest.mark.parametrize("dockerfile", [OPERATOR, RUNTIME, ROUTER])
def test_image_runs_as_a_numeric_non_root_user(dockerfile: Path) -> None:
    user = _last(dockerfile, "USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"{dockerfile.name}: USER {user}"


def test_runtime_user_is_the_uid_the_operator_runs_serving_pods_as() -> None:
    assert _last(RUNTIME, "USER").split(":")[0] == str(builders.RUN_AS_USER)
    pod = builders.pod_template("phone", AutoGLMDeploymentSpec())
    assert pod["spec"]["securityContext"]["runAsUser"] == builders.RUN_AS_USER


def test_router_image_is_what_the_operator_runs_router_pods_with() -> None:
    import json

    owner = builders.Owner("phone", "serving", "u")
    pod = router_builders.pod_template(owner, AutoGLMDeploymentSpec())["spec"]
    assert _last(ROUTER, "USER").split(":")[0] == str(pod["securityContext"]["runAsUser"])
    container = pod["containers"][0]
    assert container["command"] == json.loads(_last(ROUTER, "ENTRYPOINT"))
    assert container["ports"][0]["containerPort"] == int(_last(ROUTER, "EXPOSE"))
    # CPU only: nothing of vLLM or the engine goes into it.
    runs = " ".join(rest for k, rest in instructions(ROUTER) if k == "RUN")
    assert "vllm" not in runs.lower() and "[runtime]" not in runs


def test_operator_user_is_the_uid_the_chart_runs_it_as() -> None:
    deployment = one(render(), "Deployment", "agl-autoglm")
    security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert _last(OPERATOR, "USER") == f"{security['runAsUser']}:{security['runAsGroup']}"


@pytest.mark.parametrize(
    ("dockerfile", "script"),
    [(OPERATOR, "autoglm-operator"), (RUNTIME, "autoglm-runtime"), (ROUTER, "autoglm-router")],
)
def test_entrypoint_is_the_packages_console_script(dockerfile: Path, script: str) -> None:
    import json

    assert json.loads(_last(dockerfile, "ENTRYPOINT")) == [script]
    assert script in PYPROJECT["project"]["scripts"]


def test_runtime_command_matches_what_the_operator_runs() -> None:
    import json

    container = builders.pod_template("phone", AutoGLMDeploymentSpec())["spec"]["containers"][0]
    entrypoint = json.loads(_last(RUNTIME, "ENTRYPOINT"))
    assert container["command"][: len(entrypoint)] == entrypoint
    assert container["command"][1] == json.loads(_last(RUNTIME, "CMD"))[0] == "serve"
    assert container["ports"][0]["containerPort"] == int(_last(RUNTIME, "EXPOSE"))


def test_operator_default_command_and_chart_args_parse_with_the_real_cli() -> None:
    import json

    cmd = json.loads(_last(OPERATOR, "CMD"))
    args = cli.build_parser().parse_args(cmd)
    assert args.command == "run" and args.all_namespaces
    container = one(render(), "Deployment", "agl-autoglm")["spec"]["template"]["spec"][
        "containers"
    ][0]
    # The kubelet expands $(POD_NAME) from the container's env before the CLI sees it.
    chart_args = [a.replace("$(POD_NAME)", "agl-autoglm-0") for a in container["args"]]
    parsed = cli.build_parser().parse_args(chart_args)
    assert parsed.all_namespaces and parsed.leader_election and parsed.identity == "agl-autoglm-0"
    assert parsed.liveness == "http://0.0.0.0:8080/healthz"
    values = {
        "operator.scope": "Namespace",
        "operator.watchNamespaces": ["a", "b"],
        "operator.logLevel": "verbose",
    }
    namespaced = one(render(values), "Deployment", "agl-autoglm")["spec"]["template"]["spec"]
    namespaced = namespaced["containers"][0]["args"]
    parsed = cli.build_parser().parse_args(namespaced)
    assert parsed.namespace == ["a", "b"] and not parsed.all_namespaces and parsed.verbose


def test_chart_metrics_port_env_is_the_one_the_operator_reads() -> None:
    from autoglm_operator.io.metrics import DEFAULT_PORT, PORT_ENV

    container = one(render(), "Deployment", "agl-autoglm")["spec"]["template"]["spec"][
        "containers"
    ][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[PORT_ENV] == str(DEFAULT_PORT)


VERSION = PYPROJECT["project"]["version"]
OPERATOR_REF = f"{images.DEFAULT_REGISTRY}/{images.OPERATOR_IMAGE}:{VERSION}"
RUNTIME_REF = f"{images.DEFAULT_REGISTRY}/{images.RUNTIME_IMAGE}:{VERSION}"
ROUTER_REF = f"{images.DEFAULT_REGISTRY}/{images.ROUTER_IMAGE}:{VERSION}"
# Files that name an image: each reference must be the default one, or one in $REGISTRY.
IMAGE_REFERENCE = re.compile(
    r"([\w.\-/:$]*)/(autoglm-(?:operator|runtime|router))([:@])([\w.\-$]+)"
)
FILES_NAMING_IMAGES = [
    REPO / "README.md", REPO / "Makefile", REPO / "hack" / "images.sh",
    *sorted((REPO / "docs").rglob("*.md")),
    *sorted((REPO / "examples").glob("*.yaml")), *sorted(IMAGES.glob("*.Dockerfile")),
    *sorted(p for p in CHART.rglob("*") if p.suffix in (".yaml", ".tpl", ".txt", ".json")),
]  # fmt: skip


def _spec_image_default(crd_file: Path) -> str:
    doc = yaml.safe_load(crd_file.read_text())
    schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return str(schema["properties"]["spec"]["properties"]["image"]["default"])


def test_versions_agree_across_package_chart_and_images() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION == images.VERSION
    assert DEFAULT_IMAGE == RUNTIME_REF
    assert DEFAULT_ROUTER_IMAGE == ROUTER_REF
    assert _spec_image_default(CRD_SOURCE) == _spec_image_default(CHART_CRD) == RUNTIME_REF
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["registry"] == images.DEFAULT_REGISTRY
    example = yaml.safe_load((REPO / "examples" / "autoglm.yaml").read_text())
    assert example["spec"]["image"] == RUNTIME_REF


def test_chart_defaults_to_the_images_images_py_names() -> None:
    docs = render({"deployment.create": True})
    operator = one(docs, "Deployment", "agl-autoglm")["spec"]["template"]["spec"]["containers"][0]
    assert operator["image"] == OPERATOR_REF
    assert one(docs, "AutoGLMDeployment", "phone-9b")["spec"]["image"] == RUNTIME_REF
    assert one(docs, "AutoGLMDeployment", "phone-9b")["spec"]["router"]["image"] == ROUTER_REF


def test_one_registry_value_points_both_images_at_the_users_registry() -> None:
    registry = "registry.example.com:5000/team"
    docs = render({"image.registry": registry, "deployment.create": True})
    operator = one(docs, "Deployment", "agl-autoglm")["spec"]["template"]["spec"]["containers"][0]
    assert operator["image"] == f"{registry}/autoglm-operator:{VERSION}"
    runtime = one(docs, "AutoGLMDeployment", "phone-9b")["spec"]["image"]
    assert runtime == f"{registry}/autoglm-runtime:{VERSION}"
    router = one(docs, "AutoGLMDeployment", "phone-9b")["spec"]["router"]["image"]
    assert router == f"{registry}/autoglm-router:{VERSION}"
    # An image set in the spec, or a full operator repository, still wins.
    docs = render({
        "image.registry": registry, "image.repository": "mirror.example.com/op",
        "deployment.create": True, "deployment.spec": {
            "image": "mirror.example.com/rt:1", "router": {"image": "mirror.example.com/ro:1"},
        },
    })  # fmt: skip
    operator = one(docs, "Deployment", "agl-autoglm")["spec"]["template"]["spec"]["containers"][0]
    assert operator["image"] == f"mirror.example.com/op:{VERSION}"
    assert one(docs, "AutoGLMDeployment", "phone-9b")["spec"]["image"] == "mirror.example.com/rt:1"
    spec = one(docs, "AutoGLMDeployment", "phone-9b")["spec"]
    assert spec["router"] == {"image": "mirror.example.com/ro:1"}


@pytest.mark.parametrize("path", FILES_NAMING_IMAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_image_reference_in_docs_and_examples_is_the_current_one(path: Path) -> None:
    for registry, name, separator, tag in IMAGE_REFERENCE.findall(path.read_text()):
        ref = f"{registry}/{name}{separator}{tag}"
        assert registry in (images.DEFAULT_REGISTRY, "$REGISTRY"), f"{path.name}: {ref}"
        assert separator == ":" and tag == VERSION, f"{path.name}: {ref} is not at {VERSION}"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        if fnmatch(path, pat) or fnmatch(path, pat + "/*") or fnmatch(path, pat.replace("**/", "")):
            ignored = not negate
    return ignored


@pytest.mark.parametrize("dockerfile", [OPERATOR, RUNTIME, ROUTER])
def test_build_context_holds_every_file_the_copy_lines_need(dockerfile: Path) -> None:
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    patterns = [
        line.strip() for line in ignore.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]  # fmt: skip
    sources = []
    for keyword, rest in instructions(dockerfile):
        if keyword == "COPY" and "--from=" not in rest:
            *srcs, _dest = shlex.split(rest)
            sources += [s.rstrip("/") for s in srcs]
    assert sources, f"{dockerfile.name} copies nothing from the context"
    for source in sources:
        assert not _ignored(source, patterns), f"{source} is excluded by {ignore.name}"
        matches = list(REPO.glob(source))
        assert matches, f"{source} does not exist in the repository"
        if (REPO / source).is_dir():
            # Package sources must not be filtered out file by file.
            for file in (REPO / source).rglob("*.py"):
                rel = file.relative_to(REPO).as_posix()
                if "__pycache__" not in rel:
                    assert not _ignored(rel, patterns), f"{rel} is excluded by {ignore.name}"
    # And the bulky things stay out.
    for heavy in (".venv", ".git", "tests", "charts"):
        assert _ignored(heavy, patterns), f"{heavy} would be sent to the builder"


# -- hack/images.sh: `make images`, with stand-in builders that record what they were asked ----

FAKE_BUILDER = """#!/bin/sh
echo "$(basename "$0") $*" >> "$CALLS"
[ "$1" != info ] || exit "${DOCKER_INFO_RC:-0}"
"""


def _images_sh(tmp_path: Path, builders_: list[str], **env: str) -> tuple[int, str, list[str]]:
    """(exit status, stdout then stderr, the builder calls) of hack/images.sh."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in builders_:
        (bin_dir / name).write_text(FAKE_BUILDER)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    result = subprocess.run(
        ["bash", str(REPO / "hack" / "images.sh")],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(calls), **env},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    lines = calls.read_text().splitlines() if calls.exists() else []
    return result.returncode, result.stdout + "\n" + result.stderr, lines


def test_make_images_builds_and_pushes_both_images_with_docker(tmp_path: Path) -> None:
    registry = "registry.example.com/team"
    rc, out, calls = _images_sh(tmp_path, ["docker", "podman"], REGISTRY=registry + "/")
    assert rc == 0, out
    operator = f"{registry}/autoglm-operator:{VERSION}"
    runtime = f"{registry}/autoglm-runtime:{VERSION}"
    router = f"{registry}/autoglm-router:{VERSION}"
    assert calls == [
        "docker info",
        f"docker build -f {OPERATOR} -t {operator} {REPO}",
        f"docker build -f {RUNTIME} -t {runtime} {REPO}",
        f"docker build -f {ROUTER} -t {router} {REPO}",
        f"docker push {operator}",
        f"docker push {runtime}",
        f"docker push {router}",
    ]
    # stdout: the pushed references, one a line, for scripts.
    assert out.split("\n")[:3] == [operator, runtime, router]


def test_make_images_uses_podman_when_the_docker_daemon_is_down(tmp_path: Path) -> None:
    rc, out, calls = _images_sh(
        tmp_path, ["docker", "podman"], REGISTRY="localhost:5000/x", DOCKER_INFO_RC="1"
    )
    assert rc == 0, out
    ref = f"localhost:5000/x/autoglm-runtime:{VERSION}"
    ignore = f"{RUNTIME}.dockerignore"
    assert f"podman build --ignorefile {ignore} -f {RUNTIME} -t {ref} {REPO}" in calls
    assert f"podman push {ref}" in calls and not any(c.startswith("docker b") for c in calls)


def test_make_images_with_buildah_only_and_push_off(tmp_path: Path) -> None:
    rc, out, calls = _images_sh(tmp_path, ["buildah"], REGISTRY="r.example.com", PUSH="0")
    assert rc == 0, out
    assert [c.split()[:2] for c in calls] == [["buildah", "build"]] * 3


@pytest.mark.parametrize(
    ("builders_", "env", "message"),
    [
        (["docker"], {}, "set REGISTRY"),
        (["docker"], {"REGISTRY": "Registry.Example.com/Team"}, "not a registry host"),
        ([], {"REGISTRY": "r.example.com"}, "no image builder: install Docker"),
        (["docker"], {"REGISTRY": "r.example.com", "DOCKER_INFO_RC": "1"}, "daemon does not"),
        (["docker"], {"REGISTRY": "r.example.com", "BUILDER": "podman"}, "BUILDER=podman is not"),
    ],
)
def test_make_images_says_what_is_missing(
    tmp_path: Path, builders_: list[str], env: dict[str, str], message: str
) -> None:
    rc, out, calls = _images_sh(tmp_path, builders_, **env)
    assert rc != 0 and message in out, out
    assert not [c for c in calls if " build " in f" {c} " or " push " in f" {c} "]
