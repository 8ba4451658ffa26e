# syntax=docker/dockerfile:1
# Image of the simulated RDU kubelet device plugin (DaemonSet of the Helm chart; the chart runs it as uid 0 with every capability dropped, to write the kubelet's root-owned socket directory).
# Build from the repository root:  docker build -f docker/device-plugin.Dockerfile -t rdu-device-plugin:0.1.0 .
ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# protoc comes from the protoc-bin-vendored crate: no apt step needed.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p rdu-device-plugin --bin rdu-device-plugin \
    && install -D -m 0755 target/release/rdu-device-plugin /out/rdu-device-plugin

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/rdu-device-plugin /usr/local/bin/rdu-device-plugin
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/rdu-device-plugin"]
