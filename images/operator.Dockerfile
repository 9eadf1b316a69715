# syntax=docker/dockerfile:1
# The operator image: kopf and the Kubernetes client on slim Python 3.11, run as a non-root user.
# Build from the repository root (images/operator.Dockerfile.dockerignore limits the context):
#   docker build -f images/operator.Dockerfile -t ghcr.io/autoglm/autoglm-operator:0.1.0 .
# `make images REGISTRY=...` (hack/images.sh) builds and pushes both, tagged with the version.
# Pin the base by digest for releases: --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:...
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only the operator and the contract it shares (autoglm_api); the runtime, the router, tests and
# tooling stay out of the image.
COPY pyproject.toml README.md ./
COPY api/ api/
COPY operator/ operator/
# A venv copied whole into the final stage: no compiler, pip cache or sources left behind.
RUN python -m venv /opt/autoglm \
    && /opt/autoglm/bin/pip install ".[operator]" \
    && /opt/autoglm/bin/autoglm-operator --help > /dev/null

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/autoglm/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/autoglm /opt/autoglm
# 65532: the conventional "nonroot" uid; the chart's securityContext runs the pod as it too.
USER 65532:65532
WORKDIR /tmp
# 8080: liveness (/healthz), 9090: Prometheus metrics.
EXPOSE 8080 9090
ENTRYPOINT ["autoglm-operator"]
CMD ["run", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz"]
