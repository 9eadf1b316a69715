# syntax=docker/dockerfile:1
# The router image: autoglm-router (aiohttp, uvicorn; grpcio for the endpoint picker) on slim
# Python 3.11, CPU only: no vLLM,
# no torch, no kopf or Kubernetes client (the router speaks the pods API with aiohttp).
# Build from the repository root (images/router.Dockerfile.dockerignore limits the context):
#   docker build -f images/router.Dockerfile -t ghcr.io/autoglm/autoglm-router:0.1.0 .
# `make images REGISTRY=...` (hack/images.sh) builds and pushes it with the others.
# Pin the base by digest for releases: --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:...
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only the router and the contract it shares (autoglm_api): neither the operator nor the runtime.
COPY pyproject.toml README.md ./
COPY api/ api/
COPY router/ router/
# A venv copied whole into the final stage: no compiler, pip cache or sources left behind.
RUN python -m venv /opt/autoglm \
    && /opt/autoglm/bin/pip install ".[router]" \
    && /opt/autoglm/bin/autoglm-router --help > /dev/null

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/autoglm/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/autoglm /opt/autoglm
# The uid the operator runs router pods as (router_builders: builders.RUN_AS_USER).
USER 10001:10001
WORKDIR /tmp
# 8000: the OpenAI API (/health and /metrics on --metrics-port, the endpoint picker on
# --ext-proc-port, as the pod spec sets them).
EXPOSE 8000
ENTRYPOINT ["autoglm-router"]
