# The server image: `fusee server` on a data directory, the HTTP API (/metrics, /healthz,
# the web UI) on 7601 and the server protocol on 7600, with a token.
#
#   docker build -t fusee-server .
#   openssl rand -hex 32 > token && sudo chown 10001 token && chmod 600 token
#   docker run -d --name fusee -p 7600:7600 -p 7601:7601 \
#     -v fusee-data:/var/lib/fusee -v "$PWD/token:/etc/fusee/token:ro" fusee-server
#
# Dockerfile.dockerignore beside this file keeps the build context to what is copied
# below. tests/deploy/test_dockerfile.py runs the CMD and the HEALTHCHECK as the
# container would (no Docker daemon is needed for that).

# -- build: the two wheels ----------------------------------------------------------------
# Bookworm on both stages: the native module is linked against the glibc it runs on.
FROM rust:1-slim-bookworm AS build
# Debian bookworm's python3 is 3.11, the oldest Python fusee supports; the native module
# is abi3 (3.11 and later), so the runtime's 3.11 takes it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /build && /build/bin/pip install --no-cache-dir --upgrade pip
WORKDIR /src
# handlers/ (the function side's entry points) stays out: a server never runs them.
COPY pyproject.toml README.md ./
COPY fusee fusee
COPY server server
# pip builds each wheel with the backend its pyproject names (setuptools for fusee,
# maturin for fusee-server, which compiles the Rust disk path in release mode), as
# scripts/setup installs them; --no-deps: their dependencies come from PyPI at install.
RUN /build/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . ./server

# -- runtime ------------------------------------------------------------------------------
FROM python:3.11-slim-bookworm
COPY --from=build /wheels /wheels
# Both wheels are named: fusee-server's fusee==0.1.* is met by this checkout's fusee,
# never by a package of that name from PyPI. The dependencies come from PyPI.
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY --chmod=755 deploy/docker/fusee-healthcheck /usr/local/bin/fusee-healthcheck

# A user of its own, numeric in USER so that Kubernetes' runAsNonRoot can check it. The
# data directory is made and chowned before VOLUME: a new named volume starts as a copy
# of it, owned by the server's user.
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/fusee --shell /usr/sbin/nologin fusee \
    && mkdir -p /var/lib/fusee /etc/fusee \
    && chown fusee:fusee /var/lib/fusee \
    && chmod 700 /var/lib/fusee
VOLUME /var/lib/fusee
USER 10001:10001

# Unbuffered: each log line reaches `docker logs` when it is written.
ENV PYTHONUNBUFFERED=1
# 7600: workers and clients (server protocol); 7601: the HTTP API, /metrics, /healthz.
EXPOSE 7600 7601

# /healthz answers 503 from SIGTERM on (the log closing), so a stopping server is
# unhealthy at once. The start period covers a large directory's recovery, during which
# the HTTP API is not up yet.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["fusee-healthcheck", "http://127.0.0.1:7601/healthz", "/etc/fusee/token"]

# Exec form: the server is the container's first process, so `docker stop`'s SIGTERM
# reaches it and it stops cleanly (leases released, the log flushed and closed). The
# token file is mounted (a secret); without it the server refuses to start, naming it.
# Off loopback the server warns that bearers cross the network in clear: add
# --tls-cert/--tls-key (docs/server.md) where the network is not trusted.
CMD ["fusee", "server", "--dir", "/var/lib/fusee", "--listen", "0.0.0.0:7600", \
     "--http", "0.0.0.0:7601", "--token-file", "/etc/fusee/token"]
