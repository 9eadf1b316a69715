"""The pure builders: what the Deployment, Services, PDB, ConfigMap and Secret look like."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from autoglm_api.engine_args import (
    MIDDLEWARE_IMPORT_PATH,
    NO_MEDIA_DOMAIN,
    build_vllm_argv,
    refused_extra_arg,
)
from autoglm_api.profiles import MODE_LABEL, Mode
from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from autoglm_runtime.config import ConfigFile

OWNER = builders.Owner(name="phone-9b", namespace="serving", uid="0000-1111")


def make_spec(**fields: Any) -> AutoGLMDeploymentSpec:
    return AutoGLMDeploymentSpec.model_validate(fields)


def container(spec: AutoGLMDeploymentSpec) -> dict[str, Any]:
    return builders.deployment(OWNER, spec)["spec"]["template"]["spec"]["containers"][0]


def flag(args: list[str], name: str) -> str | None:
    """The value after `name` in argv, or "" for a bare flag, or None when absent."""
    if name not in args:
        return None
    at = args.index(name)
    nxt = args[at + 1] if at + 1 < len(args) else ""
    return "" if nxt.startswith("--") else nxt


def test_default_deployment_runs_the_reference_engine_on_two_gpus() -> None:
    c = container(make_spec())
    args = c["args"]
    assert c["command"] == ["autoglm-runtime", "serve", "--"]
    assert args[0] == "zai-org/AutoGLM-Phone-9B"
    assert flag(args, "--tensor-parallel-size") == "2"
    assert flag(args, "--dtype") == "half"
    assert flag(args, "--max-model-len") == "2048"
    assert flag(args, "--enable-chunked-prefill") == ""
    assert flag(args, "--scheduling-policy") == "priority"
    assert flag(args, "--gpu-memory-utilization") == "0.90"
    assert flag(args, "--enable-prefix-caching") == ""
    assert flag(args, "--shutdown-timeout") == "30"
    assert flag(args, "--middleware") == MIDDLEWARE_IMPORT_PATH
    assert flag(args, "--served-model-name") == "autoglm-phone-9b"
    # The envelope: large enough for batching mode, the larger of the two profiles.
    assert flag(args, "--max-num-seqs") == "64"
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_gpus_per_replica_sets_both_the_gpu_request_and_tensor_parallelism() -> None:
    spec = make_spec(gpusPerReplica=4, gpuResourceName="amd.com/gpu", dtype="bfloat16")
    c = container(spec)
    assert flag(c["args"], "--tensor-parallel-size") == "4"
    assert flag(c["args"], "--dtype") == "bfloat16"
    assert c["resources"]["requests"]["amd.com/gpu"] == "4"
    assert c["resources"]["limits"]["amd.com/gpu"] == "4"
    assert "nvidia.com/gpu" not in c["resources"]["requests"]


def test_default_cpu_and_memory_fit_a_9b_fp16_model_on_two_gpus() -> None:
    # Loading ~20 GB of FP16 weights takes tens of GB of host memory: without a request the
    # scheduler may place the pod where it is OOM-killed mid-load.
    res = container(make_spec())["resources"]
    assert res["requests"] == {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"}
    assert res["limits"] == {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "2"}


def test_cpu_and_memory_resources_sit_beside_the_gpus() -> None:
    spec = make_spec(
        resources={"requests": {"cpu": 8, "memory": "48Gi"}, "limits": {"memory": "64Gi"}}
    )
    res = container(spec)["resources"]
    assert res["requests"] == {"cpu": "8", "memory": "48Gi", "nvidia.com/gpu": "2"}
    # A map that is set replaces its default whole: no CPU limit here.
    assert res["limits"] == {"memory": "64Gi", "nvidia.com/gpu": "2"}


def _writable_volume(pod: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The emptyDir a write to `path` lands in (deepest mount wins), or None."""
    c = pod["containers"][0]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = sorted(c["volumeMounts"], key=lambda m: len(m["mountPath"]), reverse=True)
    for mount in mounts:
        if path == mount["mountPath"] or path.startswith(mount["mountPath"].rstrip("/") + "/"):
            volume = volumes[mount["name"]]
            return volume if "emptyDir" in volume and not mount.get("readOnly") else None
    return None


@pytest.mark.parametrize("model", [{}, {"pvcName": "weights"}])
def test_root_filesystem_is_read_only_and_what_vllm_writes_has_an_empty_dir(
    model: dict[str, Any],
) -> None:
    pod = builders.deployment(OWNER, make_spec(model=model))["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e.get("value") for e in c["env"]}
    home = env["HOME"]
    # vLLM's cache root (~/.cache/vllm, with the torch.compile cache) and config root, triton's
    # and flashinfer's JIT caches, torch inductor's cache and vLLM's IPC sockets in /tmp.
    written = [
        f"{env['XDG_CACHE_HOME']}/vllm/torch_compile_cache",
        f"{env['XDG_CONFIG_HOME']}/vllm/usage_stats.json",
        f"{home}/.triton/cache",
        f"{home}/.cache/flashinfer",
        f"{home}/.tilelang/cache",
        "/tmp/torchinductor_autoglm",
    ]
    for path in written:
        assert _writable_volume(pod, path), f"{path} is on the read-only root filesystem"
    # Without a weights volume vLLM downloads into HF_HOME; a PVC stays read-only.
    assert bool(_writable_volume(pod, env["HF_HOME"])) == (not model)
    limits = {v["name"]: v["emptyDir"].get("sizeLimit") for v in pod["volumes"] if "emptyDir" in v}
    assert limits["home"] and limits["tmp"]


def test_envelope_follows_the_larger_profile() -> None:
    spec = make_spec(
        profiles={"streaming": {"maxConcurrency": 200}, "batching": {"maxConcurrency": 96}}
    )
    assert flag(container(spec)["args"], "--max-num-seqs") == "200"


def test_engine_extras_reach_the_argv() -> None:
    spec = make_spec(
        engine={"maxNumBatchedTokens": 4096, "extraArgs": ["--seed", "7"], "reasoningParser": None}
    )
    args = container(spec)["args"]
    assert flag(args, "--max-num-batched-tokens") == "4096"
    assert args[-2:] == ["--seed", "7"]
    assert "--reasoning-parser" not in args


def test_pod_is_restricted_and_shaped_for_tensor_parallel_serving() -> None:
    spec = make_spec(engine={"shutdownTimeoutSeconds": 45, "startupTimeoutSeconds": 1200})
    pod = builders.deployment(OWNER, spec)["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["dshm"] == "/dev/shm"
    assert mounts["config"] == "/etc/autoglm"
    assert mounts["admin"] == "/etc/autoglm/admin"
    assert mounts["podinfo"] == "/etc/podinfo"
    assert (
        volumes["podinfo"]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"] == "metadata.labels"
    )
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1200
    # The drain must finish inside the grace period: preStop sleep plus vLLM's shutdown timeout.
    assert pod["terminationGracePeriodSeconds"] > 45 + builders.PRESTOP_SLEEP_SECONDS
    prestop = " ".join(c["lifecycle"]["preStop"]["exec"]["command"])
    assert "127.0.0.1:8001/autoglm/v1/drain" in prestop and "method='POST'" in prestop
    env = {e["name"]: e for e in c["env"]}
    assert env["AUTOGLM_ADMIN_TOKEN_FILE"]["value"] == "/etc/autoglm/admin/token"
    assert env["AUTOGLM_ADMIN_PORT"]["value"] == "8001"
    assert env["AUTOGLM_CONFIG_FILE"]["value"] == "/etc/autoglm/config.json"
    assert env["AUTOGLM_LABELS_FILE"]["value"] == "/etc/podinfo/labels"


def test_prestop_script_is_valid_python() -> None:
    script = container(make_spec())["lifecycle"]["preStop"]["exec"]["command"][2]
    compile(script, "<preStop>", "exec")


def test_model_volume_from_a_claim_is_read_only_and_the_path_is_under_it() -> None:
    spec = make_spec(model={"pvcName": "weights", "source": "AutoGLM-Phone-9B", "mountPath": "/w"})
    dep = builders.deployment(OWNER, spec)["spec"]["template"]["spec"]
    c = dep["containers"][0]
    assert c["args"][0] == "/w/AutoGLM-Phone-9B"
    model = next(v for v in dep["volumes"] if v["name"] == "model")
    assert model["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    mount = next(m for m in c["volumeMounts"] if m["name"] == "model")
    assert mount == {"name": "model", "mountPath": "/w", "readOnly": True}


def test_model_from_a_host_path() -> None:
    spec = make_spec(model={"hostPath": "/data/glm", "source": "/data/glm/phone"})
    dep = builders.deployment(OWNER, spec)["spec"]["template"]["spec"]
    assert dep["containers"][0]["args"][0] == "/data/glm/phone"
    model = next(v for v in dep["volumes"] if v["name"] == "model")
    assert model["hostPath"] == {"path": "/data/glm", "type": "Directory"}


def test_api_key_secret_reaches_vllm_by_reference_never_by_value() -> None:
    spec = make_spec(apiKeySecretRef={"name": "clients", "key": "k"})
    env = {e["name"]: e for e in container(spec)["env"]}
    assert env["VLLM_API_KEY"] == {
        "name": "VLLM_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "clients", "key": "k"}},
    }
    assert "VLLM_API_KEY" not in {e["name"] for e in container(make_spec())["env"]}


def test_mode_label_is_neither_selected_nor_templated() -> None:
    dep = builders.deployment(OWNER, make_spec())
    assert MODE_LABEL not in dep["spec"]["selector"]["matchLabels"]
    assert MODE_LABEL not in dep["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize(
    "change",
    [
        {"modePolicy": "Batching"},
        {"modePolicy": "Streaming"},
        {"profiles": {"streaming": {"maxConcurrency": 4, "maxQueue": 10}}},
        {"profiles": {"batching": {"batchWindowMillis": 50, "batchSize": 8}}},
        {"adaptive": {"intervalSeconds": 60, "prometheus": {"url": "http://p:9090"}}},
        {"replicas": 7},
    ],
)
def test_live_settings_do_not_change_the_pod_template(change: dict[str, Any]) -> None:
    before = builders.deployment(OWNER, make_spec())["spec"]["template"]
    after = builders.deployment(OWNER, make_spec(**change))["spec"]["template"]
    assert after == before


@pytest.mark.parametrize(
    "change",
    [
        {"image": "registry.local/autoglm-runtime:0.2.0"},
        {"model": {"source": "zai-org/AutoGLM-Phone-9B-v2"}},
        {"dtype": "bfloat16"},
        {"maxModelLen": 4096},
        {"gpusPerReplica": 4},
        {"engine": {"gpuMemoryUtilizationPercent": 85}},
        {"engine": {"extraArgs": ["--seed", "1"]}},
        {"profiles": {"batching": {"maxConcurrency": 128}}},  # the envelope grows
    ],
)
def test_engine_settings_change_the_template_hash(change: dict[str, Any]) -> None:
    before = builders.pod_template("phone-9b", make_spec())
    after = builders.pod_template("phone-9b", make_spec(**change))
    assert builders.template_hash(after) != builders.template_hash(before)


def test_template_hash_is_stable_and_matches_its_content() -> None:
    one = builders.pod_template("phone-9b", make_spec())
    two = builders.pod_template("phone-9b", make_spec())
    assert builders.template_hash(one) == builders.template_hash(two)
    # The digest of everything but itself and the admin volume, which names the token by it.
    stripped = json.loads(json.dumps(one))
    stripped["metadata"]["annotations"] = {}
    stripped["spec"]["volumes"] = [v for v in stripped["spec"]["volumes"] if v["name"] != "admin"]
    assert builders.digest(stripped) == builders.template_hash(one)


def test_each_pod_template_mounts_a_token_of_its_own() -> None:
    """A rollout (a new template) gives its pods a new admin token; the old pods keep theirs."""
    def token_key(spec: AutoGLMDeploymentSpec) -> str:
        pod = builders.pod_template("phone-9b", spec)
        (admin,) = [v for v in pod["spec"]["volumes"] if v["name"] == "admin"]
        assert admin["secret"]["secretName"] == "phone-9b-admin"
        (item,) = admin["secret"]["items"]
        assert item["path"] == "token"
        assert item["key"] == builders.admin_token_key(builders.template_hash(pod) or "")
        return str(item["key"])

    before, after = token_key(make_spec()), token_key(make_spec(maxModelLen=4096))
    assert before != after
    assert builders.template_of_token_key(before) == before.removeprefix("token-")
    assert builders.template_of_token_key("token") is None


def test_the_admin_port_is_named_and_the_token_reaches_the_pod_only_as_a_file() -> None:
    c = container(make_spec(apiKeySecretRef={"name": "keys", "key": "k"}))
    assert {"name": "admin", "containerPort": 8001, "protocol": "TCP"} in c["ports"]
    # The probes stay on the API port: the admin port answers only with the token.
    assert c["readinessProbe"]["httpGet"]["port"] == "http"
    assert c["livenessProbe"]["tcpSocket"]["port"] == "http"
    secrets = [e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"]
               if "secretKeyRef" in e.get("valueFrom", {})]
    assert secrets == ["keys"]  # the client API key; the admin token is no variable


def test_every_child_is_owned_and_labelled() -> None:
    objs = [*builders.children(OWNER, make_spec()), builders.admin_secret(OWNER, {"abc": "t"})]
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in objs)
    assert kinds == [
        ("ConfigMap", "phone-9b-config"),
        ("Deployment", "phone-9b"),
        ("PodDisruptionBudget", "phone-9b"),
        ("Secret", "phone-9b-admin"),
        ("Service", "phone-9b"),
        ("Service", "phone-9b-batching"),
        ("Service", "phone-9b-streaming"),
    ]
    for obj in objs:
        meta = obj["metadata"]
        assert meta["namespace"] == "serving"
        assert meta["labels"][builders.MANAGED_BY_LABEL] == "autoglm-operator"
        assert meta["labels"][builders.INSTANCE_LABEL] == "phone-9b"
        (ref,) = meta["ownerReferences"]
        assert ref == {
            "apiVersion": "autoglm.io/v1alpha1",
            "kind": "AutoGLMDeployment",
            "name": "phone-9b",
            "uid": "0000-1111",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        json.dumps(obj)  # plain data only


def test_services_select_all_replicas_or_one_mode() -> None:
    spec = make_spec(service={"type": "NodePort", "port": 9000, "nodePort": 30080})
    main = builders.service(OWNER, spec)
    assert main["spec"]["type"] == "NodePort"
    assert main["spec"]["ports"] == [
        {"name": "http", "port": 9000, "targetPort": "http", "protocol": "TCP", "nodePort": 30080}
    ]
    assert main["spec"]["selector"] == builders.selector_labels("phone-9b")
    for mode in Mode:
        svc = builders.service(OWNER, spec, mode)
        assert svc["metadata"]["name"] == f"phone-9b-{mode.value}"
        assert svc["spec"]["type"] == "ClusterIP"
        assert svc["spec"]["selector"] == {
            **builders.selector_labels("phone-9b"),
            MODE_LABEL: mode.value,
        }
        assert "nodePort" not in svc["spec"]["ports"][0]


def test_pdb_allows_one_replica_down() -> None:
    pdb = builders.pod_disruption_budget(OWNER)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == builders.selector_labels("phone-9b")


@pytest.mark.parametrize(
    ("policy", "mode"),
    [("Adaptive", "streaming"), ("Streaming", "streaming"), ("Batching", "batching")],
)
def test_runtime_config_is_what_the_runtime_parses(policy: str, mode: str) -> None:
    spec = make_spec(modePolicy=policy, maxModelLen=1024, adaptive={"paused": True})
    cm = builders.config_map(OWNER, spec)
    parsed = ConfigFile.model_validate(json.loads(cm["data"]["config.json"]))
    assert parsed.initial_mode.value == mode
    assert parsed.profiles == spec.profiles
    assert parsed.served_model_name == "autoglm-phone-9b"
    assert parsed.max_model_len == 1024
    assert parsed.default_max_tokens == 512


def test_admin_secret_carries_a_token_per_pod_template() -> None:
    secret = builders.admin_secret(OWNER, {"abc": "s3cret", "def": "other"})
    assert base64.b64decode(secret["data"]["token-abc"]).decode() == "s3cret"
    assert base64.b64decode(secret["data"]["token-def"]).decode() == "other"


def test_rolling_strategy_is_make_before_break_unless_told_otherwise() -> None:
    surge = builders.deployment(OWNER, make_spec())["spec"]["strategy"]["rollingUpdate"]
    assert surge == {"maxSurge": 1, "maxUnavailable": 0}
    fallback = builders.deployment(OWNER, make_spec(), surge=False)["spec"]["strategy"]
    assert fallback["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    # The strategy is not part of the template: switching it rolls nothing.
    assert (
        builders.deployment(OWNER, make_spec(), surge=False)["spec"]["template"]
        == (builders.deployment(OWNER, make_spec())["spec"]["template"])
    )


def test_status_helpers() -> None:
    spec = make_spec(service={"port": 8080})
    assert (
        builders.endpoint_url("phone-9b", "serving", spec) == "http://phone-9b.serving.svc:8080/v1"
    )
    assert builders.selector_string("phone-9b") == (
        "app.kubernetes.io/instance=phone-9b,app.kubernetes.io/name=autoglm"
    )


@pytest.mark.parametrize("legacy", [
    ["--limit-mm-per-prompt", '{"image":4}'],
    ['--limit-mm-per-prompt={"image":4}'],
    ["--allowed-media-domains", "cdn.example", "img.example"],
    ["--mm-processor-kwargs", '{"max_pixels":5000000}'],
    ["--mm-encoder-tp-mode", "data"],
])
def test_an_object_admitted_with_a_now_managed_media_flag_still_gets_pods_that_start(
    legacy: list[str],
) -> None:
    """Objects that carried these flags before the runtime managed them keep them (the
    apiserver ratchets unchanged fields); their pods are built without them, so the launcher,
    which refuses them, still starts the engine."""
    extra_args = [*legacy, "--seed", "7"]
    spec = AutoGLMDeploymentSpec.model_validate({"engine": {"extraArgs": extra_args}})
    settings = builders.engine_settings(spec)
    assert settings.extra_args == ("--seed", "7")
    assert not [arg for arg in settings.extra_args if refused_extra_arg(arg)]


def test_spec_multimodal_sets_the_engines_image_limit_and_media_hosts() -> None:
    spec = AutoGLMDeploymentSpec.model_validate(
        {"multimodal": {"imagesPerPrompt": 4, "allowedMediaDomains": ["cdn.example.com"]}}
    )
    argv = build_vllm_argv(builders.engine_settings(spec))
    assert argv[argv.index("--limit-mm-per-prompt") + 1] == '{"image":4,"video":0}'
    assert argv[argv.index("--allowed-media-domains") + 1 :][:1] == ["cdn.example.com"]
    default = build_vllm_argv(builders.engine_settings(AutoGLMDeploymentSpec()))
    # None allowed: a name that never resolves, since vLLM takes any host when the list is empty.
    assert default[default.index("--allowed-media-domains") + 1] == NO_MEDIA_DOMAIN


@pytest.mark.parametrize(("spec", "max_pixels"), [
    ({}, 1_207_360),  # 2048 tokens: one screenshot beside the agent's prompt and 512 tokens
    ({"maxModelLen": 25480}, 5_000_000),  # the model's official serve command
    ({"maxModelLen": 25480, "multimodal": {"maxPixels": 2_000_000}}, 2_000_000),
])  # fmt: skip
def test_the_image_budget_follows_the_context_unless_set(
    spec: dict[str, Any], max_pixels: int
) -> None:
    argv = build_vllm_argv(builders.engine_settings(AutoGLMDeploymentSpec.model_validate(spec)))
    kwargs = json.loads(argv[argv.index("--mm-processor-kwargs") + 1])
    # As the processor takes it: `size`, in pixels of area (transformers 5 has no max_pixels).
    assert kwargs == {"size": {"shortest_edge": 12544, "longest_edge": max_pixels}}


@pytest.mark.parametrize("domain", ["localhost", "10.0.0.1", "metadata.internal", "a.svc", "X.io"])
def test_spec_multimodal_refuses_hosts_inside_the_cluster_or_node(domain: str) -> None:
    with pytest.raises(ValueError):
        AutoGLMDeploymentSpec.model_validate(
            {"multimodal": {"allowedMediaDomains": [domain]}}
        )
