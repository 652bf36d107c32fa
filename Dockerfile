# syntax=docker/dockerfile:1
# quota-worker image: build in the Rust image, run in slim Debian as a non-root user.
#
#   docker build -t quota-worker .
#   docker run --rm quota-worker config check
#
# Dependencies are cached in BuildKit cache mounts (the cargo registry and target/),
# so a rebuild after a change to src/ compiles only the crate itself. Cache mounts,
# rather than a layer built from stub sources, keep working whatever targets
# Cargo.toml declares (benches, tests, extra binaries). `docker compose` and
# `docker build` use BuildKit by default.

# ---- builder ----------------------------------------------------------------------
FROM rust:1-slim-bookworm AS builder
WORKDIR /build
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/build/target,sharing=locked \
    cargo build --release --locked --bin quota-worker \
    && cp target/release/quota-worker /usr/local/bin/quota-worker

# ---- runtime ----------------------------------------------------------------------
FROM debian:bookworm-slim AS runtime

# ca-certificates for amqps:// and rediss:// URLs; curl for the compose health check
# on /healthz.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin quota

COPY --from=builder /usr/local/bin/quota-worker /usr/local/bin/quota-worker

USER 10001:10001
# /metrics, /healthz and /readyz. The built-in default listens on 127.0.0.1 only,
# which nothing outside the container could reach.
ENV QUOTA_WORKER__HTTP__LISTEN=0.0.0.0:9464
EXPOSE 9464

ENTRYPOINT ["quota-worker"]
CMD ["run"]
