# syntax=docker/dockerfile:1
# inboxcrm worker / relay image. One image, two entry points:
#   docker run IMAGE                                   -> python -m inboxcrm.worker (default)
#   docker run IMAGE python -m inboxcrm.ingress.main     -> the webhook relay
#   docker run IMAGE python deploy/bootstrap.py        -> migrations + search attributes (job)
# Runtime dependencies are installed from pyproject.toml, pinned with their sha256s by
# constraints.txt (pip's hash-checking mode, `make pin-hashes`); the
# local stack's wheels (embedded PostgreSQL, the Temporal dev server: the `local` extra) and
# the test tools are extras, so they are not in the image.
# The base image, pinned by digest (the multi-platform index of python:3.11-slim as
# published): a tag can be re-pointed under us, a digest cannot. Moving to a newer base is
# a reviewed change of this line (deploy/README.md "Building the image"); CI cannot build
# images (no Docker engine here), tests/fast/test_deploy_config.py checks the pin's form.
ARG PYTHON_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY pyproject.toml constraints.txt README.md LICENSE ./
COPY deploy/pip.txt ./deploy/pip.txt
# The base image's pip may be too old to honour a constraint's hashes: the pinned one first.
RUN pip install --require-hashes -r deploy/pip.txt
RUN python - <<'PY' > /tmp/runtime-requirements.txt
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))
PY
RUN pip install --require-hashes -c constraints.txt -r /tmp/runtime-requirements.txt
COPY inboxcrm ./inboxcrm
# The build context has no .git: the version is given, as the release tag without its "v"
# (docker build --build-arg VERSION=0.2.0 …; deploy/README.md "Building the image").
ARG VERSION=0.3.0.dev0
RUN SETUPTOOLS_SCM_PRETEND_VERSION="$VERSION" pip install --no-deps . \
 && python -c "import inboxcrm.worker, inboxcrm.ingress.main"

FROM ${PYTHON_IMAGE}
ARG VERSION=0.3.0.dev0
LABEL org.opencontainers.image.title="inboxcrm" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 inboxcrm \
 && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home \
            --shell /usr/sbin/nologin inboxcrm
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# No tenant policies in the image (the repository's are demo tenants, one of them with
# sender authentication off): mount yours at /app/policies (INBOXCRM_POLICY_DIR).
COPY deploy/bootstrap.py deploy/healthcheck.py deploy/codec_proxy.py ./deploy/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    INBOXCRM_POLICY_DIR=/app/policies \
    INBOXCRM_RELAY_HOST=0.0.0.0 \
    INBOXCRM_RELAY_METRICS_ADDRESS=0.0.0.0:9465 \
    INBOXCRM_WORKER_METRICS_ADDRESS=0.0.0.0:9464
USER 10001:10001
# 8080: relay (webhooks, /healthz, codec: the public port); 9465: relay Prometheus metrics
# and 9464: worker Prometheus metrics (internal: never route the public ingress to them).
EXPOSE 8080 9464 9465
CMD ["python", "-m", "inboxcrm.worker"]
