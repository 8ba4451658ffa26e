# syntax=docker/dockerfile:1
# Image of the RduJob operator (Deployment of the Helm chart).
# Build from the repository root:  docker build -f docker/operator.Dockerfile -t rdu-operator:0.1.0 .
ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# protoc comes from the protoc-bin-vendored crate: no apt step needed.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p rdu-operator --bin rdu-operator \
    && install -D -m 0755 target/release/rdu-operator /out/rdu-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/rdu-operator /usr/local/bin/rdu-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/rdu-operator"]
