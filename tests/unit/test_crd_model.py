"""The CRD in crds/ is generated from the pydantic spec model; these keep the two one thing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.resource import spec, status
from autoglm_operator.resource.crd import build_crd, render_crd_yaml

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "autoglm.io_autoglmdeployments.yaml"
K8S_SCHEMA_FILE = REPO / "operator" / "autoglm_operator" / "resource" / "k8s_scheduling_schema.json"


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)] if isinstance(node, dict) else []
    if isinstance(node, dict):
        for key, child in node.get("properties", {}).items():
            found += _walk(child, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            found += _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            found += _walk(node["additionalProperties"], f"{path}{{}}")
    return found


def test_committed_crd_is_generated_from_the_model() -> None:
    assert CRD_FILE.read_text() == render_crd_yaml(), "run `make crd` and commit the result"


def test_schema_is_structural() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert not {"anyOf", "oneOf", "allOf", "$ref", "title"} & node.keys(), path
        assert (
            "type" in node
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        ), f"{path} has no type"


def _model_fields(model: type[spec.CamelModel]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


def test_every_model_field_is_in_the_crd_and_back() -> None:
    props = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    assert set(props["spec"]["properties"]) == _model_fields(spec.AutoGLMDeploymentSpec)
    adaptive = props["spec"]["properties"]["adaptive"]["properties"]
    assert set(adaptive) == _model_fields(spec.AdaptiveSettings)
    streaming = props["spec"]["properties"]["profiles"]["properties"]["streaming"]["properties"]
    assert set(streaming) == _model_fields(spec.ModeProfiles.model_fields["streaming"].annotation)  # type: ignore[arg-type]
    assert set(props["status"]["properties"]) == _model_fields(status.AutoGLMDeploymentStatus)


def test_model_defaults_are_the_crd_defaults() -> None:
    """Every default in the CRD equals the model's, so code and apiserver fill in the same."""
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    defaults = spec.AutoGLMDeploymentSpec().model_dump(
        by_alias=True, mode="json", exclude_none=True
    )
    checked = 0
    for path, node in _walk(schema["properties"]["spec"]):
        if "default" not in node or not path or "[]" in path or "{}" in path:
            continue
        value: Any = defaults
        for key in path.strip(".").split("."):
            value = None if value is None else value.get(key)
        if value is None:  # beneath an optional object the user has not set
            continue
        assert node["default"] == value, path
        checked += 1
    assert checked > 40


def test_subresources_and_printer_columns() -> None:
    version = build_crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Ready", "Streaming", "Batching", "Routers", "Policy", "Standby", "Desired", "Scaling",
        "Endpoint", "Age",
    ]  # fmt: skip


def test_example_is_a_valid_spec() -> None:
    example = yaml.safe_load((REPO / "examples" / "autoglm.yaml").read_text())
    parsed = spec.AutoGLMDeploymentSpec.model_validate(example["spec"])
    assert parsed.replicas == 2
    assert parsed.gpus_per_replica == 2 and parsed.max_model_len == 2048


def _spec_schema() -> dict[str, Any]:
    schema: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]


def test_mount_path_rules_know_every_mount_of_the_runtime() -> None:
    """model.mountPath may not collide with the runtime's own mounts: the rules name exactly the
    paths the pod template mounts, so a mount added to the builders must be added to them."""
    template = builders.pod_template("phone-9b", spec.AutoGLMDeploymentSpec())
    (container,) = template["spec"]["containers"]
    mounted = {m["mountPath"] for m in container["volumeMounts"] if m["name"] != "model"}
    assert mounted == set(spec.RUNTIME_MOUNT_PATHS)
    rules = _spec_schema()["properties"]["model"]["properties"]["mountPath"]
    rule_text = " ".join(r["rule"] for r in rules["x-kubernetes-validations"])
    for path in (*spec.RUNTIME_MOUNT_PATHS, *spec.SYSTEM_DIRS):
        assert f"'{path}'" in rule_text, path


def test_scheduling_fields_carry_kubernetes_own_schemas() -> None:
    committed = json.loads(K8S_SCHEMA_FILE.read_text())["definitions"]
    scheduling = _spec_schema()["properties"]["scheduling"]["properties"]
    toleration = scheduling["tolerations"]["items"]
    assert set(toleration["properties"]) == set(committed["Toleration"]["properties"])
    assert toleration["properties"]["effect"]["enum"] == [
        "", "NoSchedule", "PreferNoSchedule", "NoExecute",
    ]  # fmt: skip
    affinity = scheduling["affinity"]
    assert set(affinity["properties"]) == {"nodeAffinity", "podAffinity", "podAntiAffinity"}
    node_terms = affinity["properties"]["nodeAffinity"]["properties"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["properties"]["nodeSelectorTerms"]
    requirement = node_terms["items"]["properties"]["matchExpressions"]["items"]
    assert requirement["required"] == ["key", "operator"]
    assert requirement["properties"]["operator"]["enum"] == [
        "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt",
    ]  # fmt: skip
    assert any("needs values" in r["message"] for r in requirement["x-kubernetes-validations"])


def test_scheduling_lists_and_strings_are_bounded_for_cel() -> None:
    """The apiserver refuses CEL rules whose estimated cost is unbounded: every list, map and
    free string in tolerations and affinity has a size limit."""
    scheduling = _spec_schema()["properties"]["scheduling"]["properties"]
    nodes = _walk(scheduling["tolerations"], "tolerations") + _walk(scheduling["affinity"])
    for path, node in nodes:
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, path


def test_every_scheduling_rule_message_names_its_field() -> None:
    scheduling = _spec_schema()["properties"]["scheduling"]["properties"]
    for field in ("tolerations", "affinity"):
        for path, node in _walk(scheduling[field], field):
            for rule in node.get("x-kubernetes-validations", []):
                assert rule["message"].startswith(f"scheduling.{field}: "), path


def _extra_args_refusals(arg: str) -> list[str]:
    """The messages of the CRD's extraArgs rules that refuse this arg (their regexes read with
    Python's `re`, which agrees with CEL's RE2 on these patterns)."""
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    extra_args = schema["properties"]["spec"]["properties"]["engine"]["properties"]["extraArgs"]
    messages = []
    for rule in extra_args["x-kubernetes-validations"]:
        pattern = re.fullmatch(r"self\.all\(a, !a\.matches\('(.*)'\)\)", rule["rule"])
        assert pattern, rule["rule"]
        if re.search(pattern.group(1), arg):
            messages.append(rule["message"])
    return messages


# Spellings vLLM 0.32's parser reads as a managed flag (checked against the real parser by
# tests/vllm/test_vllm_managed_flags.py): `_` for `-`, unique abbreviations, aliases, `.key`.
@pytest.mark.parametrize("arg, flag, instead", [
    ("--max_model_len", "--max-model-len", "use maxModelLen"),
    ("--max_model_len=4096", "--max-model-len", "use maxModelLen"),
    ("--dtyp", "--dtype", "use dtype"),
    ("--dt=float32", "--dtype", "use dtype"),
    ("--tensor-parallel", "--tensor-parallel-size", "use gpusPerReplica"),
    ("-tp", "--tensor-parallel-size", "use gpusPerReplica"),
    ("-t=1", "--tensor-parallel-size", "use gpusPerReplica"),
    ("--served-model-name.x", "--served-model-name", "use model.servedName"),
    ("--no_enable_prefix", "--enable-prefix-caching", "use engine.enablePrefixCaching"),
    ("--disable-prefix-caching", "--enable-prefix-caching", "use engine.enablePrefixCaching"),
    ("--disable-chunked-p", "--enable-chunked-prefill", "the operator always turns it on"),
    ("--device-memory-utilization=0.5", "--gpu-memory-utilization",
     "use engine.gpuMemoryUtilizationPercent"),
    ("--max-num-b", "--max-num-batched-tokens", "use engine.maxNumBatchedTokens"),
    ("--ho", "--host", "the operator sets it"),
    ("--stre", "--stream-interval", "use the profiles' streamCoalesceChunks"),
    ("--reasoning_parser=x", "--reasoning-parser", "use engine.reasoningParser"),
])  # fmt: skip
def test_extra_args_refuse_every_spelling_of_a_managed_flag(
    arg: str, flag: str, instead: str
) -> None:
    [message] = _extra_args_refusals(arg)
    assert message.startswith(f"engine.extraArgs may not set a flag the operator manages: {flag} ")
    assert message.endswith(instead)


def test_extra_args_refuse_a_config_file() -> None:
    for arg in ("--config", "--config=/etc/vllm.yaml"):
        assert _extra_args_refusals(arg) == [
            "engine.extraArgs may not use --config: its YAML could set a managed flag or "
            "--api-key out of sight; list the flags themselves in extraArgs instead"
        ]


@pytest.mark.parametrize("arg", [
    "--enforce-eager", "--seed=0", "0", "/models/x",
    # flags of their own that share a prefix with a managed one
    "--max-num-partial-prefills", "--reasoning-parser-plugin", "--config-format=hf",
    "--pooler-config", "--scheduler-cls", "--device-ids", "--enable-chunked-mm-input",
    "--disable-log-stats", "--mm-processor-cache-gb=4", "--api-server-count",
    # ambiguous in vLLM (it refuses them itself), not a managed flag's
    "--max-n", "--po", "--d",
])  # fmt: skip
def test_extra_args_rules_pass_other_flags(arg: str) -> None:
    assert _extra_args_refusals(arg) == []
