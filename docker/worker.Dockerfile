# syntax=docker/dockerfile:1
# Image of one rank of an RduJob (the operator runs it with args ["run"]); carries examples/data at /opt/rdu/examples/data.
# Build from the repository root:  docker build -f docker/worker.Dockerfile -t rdu-worker:0.1.0 .
ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# protoc comes from the protoc-bin-vendored crate: no apt step needed.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p rdu-worker --bin rdu-worker \
    && install -D -m 0755 target/release/rdu-worker /out/rdu-worker

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/rdu-worker /usr/local/bin/rdu-worker
# examples/digits.yaml says `path: data/digits.csv.gz`, relative to the working directory.
COPY --chown=65532:65532 examples/data /opt/rdu/examples/data
WORKDIR /opt/rdu/examples
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/rdu-worker"]
