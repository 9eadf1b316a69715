"""GIE's endpoint picker as the repo builds and deploys it (hack/gie-epp.sh, testkit.gie): the
release whose CRD the repo installs, verified against recorded hashes, pointed at the pool the
operator publishes for pods that carry the serving pods' labels. Nothing is built or started."""

from __future__ import annotations

import re

from autoglm_operator.reconcile.children import gateway, serving
from testkit import gie
from testkit.gateway import gateway_config
from testkit.paths import HACK

MODULE = "sigs.k8s.io/gateway-api-inference-extension"


def _pinned(script: str) -> str:
    (version,) = re.findall(r"^GIE_VERSION=(\S+)$", (HACK / script).read_text(), re.MULTILINE)
    return version


def test_the_picker_is_built_at_the_release_whose_crd_the_repo_installs() -> None:
    version = _pinned("gie-epp.sh")
    assert version == _pinned("gie-crds.sh") == gateway.GIE_VERSION
    assert f"require {MODULE} {version} " in (HACK / "gie-epp" / "go.mod").read_text()


def test_the_build_takes_only_modules_whose_hashes_are_recorded() -> None:
    script = (HACK / "gie-epp.sh").read_text()
    assert "GOFLAGS=-mod=readonly" in script and "-mod=mod" not in script
    sums = (HACK / "gie-epp" / "go.sum").read_text()
    # The module zip's hash is the one gie-crds.sh checks its CRD download against.
    (crd_sum,) = re.findall(r"^GIE_SUM=(\S+)$", (HACK / "gie-crds.sh").read_text(), re.MULTILINE)
    assert f"{MODULE} {_pinned('gie-epp.sh')} {crd_sum}\n" in sums


def test_the_pool_selects_the_deployments_pods_on_their_api_port() -> None:
    config_map, deployment, pool = gie.serving_manifests(4, {"initialMode": "streaming"})
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert pool["kind"] == "InferencePool" and pool["apiVersion"] == gateway.API_VERSION
    assert pool["metadata"] == {"name": gie.POOL, "namespace": gie.NAMESPACE,
                                "labels": serving.common_labels(gie.POOL)}  # fmt: skip
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (port,) = template["spec"]["containers"][0]["ports"]
    assert pool["spec"]["targetPorts"] == [{"number": port["containerPort"]}]
    assert deployment["spec"]["replicas"] == 4
    assert config_map["metadata"]["name"] == template["spec"]["volumes"][0]["configMap"]["name"]


def test_envoy_talks_to_the_epp_as_gies_own_configuration_does() -> None:
    bootstrap = gateway_config(port=1, admin_port=2, picker_port=3, **gie.EPP_PROCESSING)
    manager = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    ext_proc = manager["typed_config"]["http_filters"][1]["typed_config"]
    assert ext_proc["processing_mode"] == {
        "request_header_mode": "SEND", "request_body_mode": "FULL_DUPLEX_STREAMED",
        "request_trailer_mode": "SEND", "response_header_mode": "SEND",
        "response_body_mode": "FULL_DUPLEX_STREAMED", "response_trailer_mode": "SEND"}
