# syntax=docker/dockerfile:1
# Herald's image: the `herald` binary on distroless (glibc, no shell), as a
# non-root user. Build from the repository root:
#   docker build -t herald:0.1.0 .
# No container engine runs where Herald is developed and tested: this file is
# not built by the test suite or CI (see helm/herald/README.md).

# Build: the whole workspace is needed to resolve it; only the gateway is built.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p gateway --bin herald \
    && cp target/release/herald /herald

# Run: distroless cc carries glibc and libgcc, all herald links against
# (libc, libm, libgcc_s); its `nonroot` user is 65532, as the chart expects.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /herald /usr/local/bin/herald
# Every key with its default; the chart mounts its own herald.toml at
# /etc/herald/herald.toml and names it with HERALD_CONFIG.
COPY docs/herald.sample.toml /etc/herald/herald.sample.toml
USER 65532:65532
# HTTP and WebSocket (/ws, /v1/publish, /healthz, /readyz, /metrics); gRPC.
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/herald"]
