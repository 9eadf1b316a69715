# syntax=docker/dockerfile:1
# The serving image: the official vLLM OpenAI server at the pinned release, plus autoglm-runtime
# (the launcher and the mode middleware `vllm serve --middleware` loads) with the contract it
# shares (autoglm_api); neither the operator, the router nor the sim.
# Build from the repository root (images/runtime.Dockerfile.dockerignore limits the context):
#   docker build -f images/runtime.Dockerfile -t ghcr.io/autoglm/autoglm-runtime:0.1.0 .
# `make images REGISTRY=...` (hack/images.sh) builds and pushes both, tagged with the version.
# The tag must match PINNED_VLLM_VERSION in api/autoglm_api/engine_args.py; a unit test
# keeps them equal. Pin by digest for releases: --build-arg VLLM_IMAGE=vllm/vllm-openai:v0.32.0@sha256:...
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}

COPY pyproject.toml README.md /tmp/autoglm/
COPY api/ /tmp/autoglm/api/
COPY runtime/ /tmp/autoglm/runtime/

# Install into vLLM's own (system) Python with the uv the image ships, and move nothing vLLM
# pinned: every package already installed is a constraint (direct-URL lines cannot be).
RUN set -eux; \
    uv pip freeze --system | grep -v ' @ ' > /tmp/vllm-constraints.txt; \
    uv pip install --system --no-cache --constraint /tmp/vllm-constraints.txt "/tmp/autoglm[runtime]"; \
    rm -rf /tmp/autoglm /tmp/vllm-constraints.txt; \
    autoglm-runtime --help > /dev/null

# The operator runs serving pods as uid 10001 (RUN_AS_USER in operator/autoglm_operator/
# reconcile/children/serving.py): a high uid, so it is no node user's. It gets a passwd entry (getpass, `~`).
# vLLM, torch, triton and flashinfer keep JIT caches under $HOME, so HOME is a directory that
# uid (and group 0, for arbitrary-uid platforms) can write; in a pod the root filesystem is
# read-only and HOME and /tmp are emptyDirs.
ENV HOME=/home/autoglm \
    XDG_CACHE_HOME=/home/autoglm/.cache \
    PYTHONUNBUFFERED=1
RUN useradd --uid 10001 --gid 0 --home-dir /home/autoglm --create-home --no-log-init \
        --shell /usr/sbin/nologin autoglm \
    && install -d -o 10001 -g 0 -m 0775 /home/autoglm/.cache \
    && chmod 0775 /home/autoglm
USER 10001:0
WORKDIR /home/autoglm
EXPOSE 8000
# The operator sets the command (`autoglm-runtime serve -- <vllm argv>`); this default serves
# the model with the built-in defaults. The CPU sim is the test harness's, not in this image.
ENTRYPOINT ["autoglm-runtime"]
CMD ["serve"]
