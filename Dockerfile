# inferd's container image (docs/deploy.md): wheels built in one stage, installed into a
# virtual environment, and only that environment copied into a slim runtime with no
# compilers. Build it with scripts/build-image.sh (podman or buildah).
#
# Build arguments:
#   BASE_IMAGE  a Python 3.11 image, pinned (an exact tag; add @sha256:... to pin it by
#               digest). scripts/build-image.sh --debootstrap passes a Debian root it made.
#   EXTRAS      inferd's extras to install: "torch" (the PyTorch backend; default), "",
#               "torch,gpu,otel", ...
#   ONNXRUNTIME the ONNX Runtime distribution: onnxruntime (CPU), onnxruntime-gpu (CUDA)
#   PIP_ARGS    extra pip arguments for the wheel build, e.g. an index with CPU-only torch
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_CERT: pip's own settings (a mirror, the CA of a
#               proxy), when given; with PIP_CERT, mount the file (build -v FILE:FILE:ro)
#   ALLOCATOR   none (glibc's malloc), jemalloc or tcmalloc: installed and linked at
#               /usr/local/lib/inferd-malloc.so; LD_PRELOAD it to use it (docs/deploy.md)
ARG BASE_IMAGE=python:3.11.13-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG EXTRAS=torch
ARG ONNXRUNTIME=onnxruntime
ARG PIP_ARGS=""
# Unset unless given (ARG without a default), so pip's defaults hold.
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# Binary wheels of the dependencies (--prefer-binary; all have them for Python 3.11), so
# this stage needs no compiler either; inferd itself is pure Python. Another ONNX Runtime
# build (onnxruntime-gpu) replaces the CPU one, whose module it provides: the resolved set
# is then installed as is (--no-deps), since its distribution name differs.
RUN set -eu; \
    python3 -m venv /opt/inferd; \
    /opt/inferd/bin/pip wheel --wheel-dir /wheels --prefer-binary ${PIP_ARGS} \
      ".${EXTRAS:+[$EXTRAS]}" "${ONNXRUNTIME}"; \
    deps=""; \
    if [ "${ONNXRUNTIME}" != onnxruntime ]; then \
      rm -f /wheels/onnxruntime-[0-9]*.whl; deps=--no-deps; \
    fi; \
    /opt/inferd/bin/pip install --no-index ${deps} --find-links /wheels /wheels/*.whl; \
    /opt/inferd/bin/inferd --version

FROM ${BASE_IMAGE} AS runtime
ARG ALLOCATOR=none
# tini is PID 1: it forwards SIGTERM to inferd (which drains, then exits 0) and reaps
# the Python backend's worker processes.
RUN set -eu; \
    case "${ALLOCATOR}" in \
      none) malloc="" ;; jemalloc) malloc=libjemalloc2 ;; tcmalloc) malloc=libtcmalloc-minimal4 ;; \
      *) echo "ALLOCATOR must be none, jemalloc or tcmalloc, not '${ALLOCATOR}'" >&2; exit 1 ;; \
    esac; \
    apt-get update; \
    apt-get install -y --no-install-recommends tini ${malloc}; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin; \
    if [ -n "${malloc}" ]; then \
      ln -s "$(dpkg -L "${malloc}" | grep -E '/lib(jemalloc|tcmalloc_minimal)\.so\.[0-9]+$')" \
        /usr/local/lib/inferd-malloc.so; \
    fi; \
    groupadd --gid 10001 inferd; \
    useradd --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin inferd; \
    mkdir -p /models
COPY --from=build /opt/inferd /opt/inferd
# HOME=/tmp: libraries that write caches find a writable home under a read-only root.
ENV PATH=/opt/inferd/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    INFERD_MODEL_REPOSITORY=/models \
    INFERD_HOST=0.0.0.0
USER 10001:10001
EXPOSE 8000 8001 8002
# Ready means every model loaded (strict, as Triton's); loading may take minutes.
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('INFERD_HTTP_PORT', '8000') + '/v2/health/ready', timeout=2)"]
ENTRYPOINT ["/usr/bin/tini", "--", "inferd"]
CMD ["serve"]
