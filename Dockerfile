# syntax=docker/dockerfile:1
# quota-worker image: build in the Rust image, run in slim Debian as a non-root user.
#
#   docker build -t quota-worker .
#   docker run --rm quota-worker config check
#
# Dependencies are cached in BuildKit cache mounts (the cargo registry and target/),
# so a rebuild after a change to src/ compiles only the crate itself. `docker compose`
# and `docker build` use BuildKit by default.
#
# deploy/chroot-build.sh reproduces both stages in debootstrap chroots of the same
# Debian release, with exactly these packages, on a machine without a Docker engine;
# it reads the two package lists below from this file.

# ---- builder ----------------------------------------------------------------------
# The Rust release the project is built and tested with; bookworm, as the runtime.
FROM rust:1.95-slim-bookworm AS builder
# make: tikv-jemalloc-sys's build script runs it (the slim image has gcc but no make).
ARG BUILD_PACKAGES="make"
RUN apt-get update \
    && apt-get install -y --no-install-recommends ${BUILD_PACKAGES} \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /build
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/build/target,sharing=locked \
    cargo build --release --locked --bin quota-worker \
    && cp target/release/quota-worker /usr/local/bin/quota-worker

# ---- runtime ----------------------------------------------------------------------
# The same Debian release as the builder: the binary links against its glibc.
FROM debian:bookworm-slim AS runtime

# ca-certificates: the system roots that amqps:// and rediss:// verify against by
# default. Nothing else: the health check is the binary itself.
ARG RUNTIME_PACKAGES="ca-certificates"
RUN apt-get update \
    && apt-get install -y --no-install-recommends ${RUNTIME_PACKAGES} \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin quota

COPY --from=builder /usr/local/bin/quota-worker /usr/local/bin/quota-worker

USER 10001:10001
# /metrics, /healthz and /readyz. The built-in default listens on 127.0.0.1 only,
# which nothing outside the container could reach.
ENV QUOTA_WORKER__HTTP__LISTEN=0.0.0.0:9464
EXPOSE 9464
# `quota-worker health` asks /healthz on http.listen (0.0.0.0 is asked on loopback).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["quota-worker", "health"]

ENTRYPOINT ["quota-worker"]
CMD ["run"]
