# toolrun/runner: the static toolrun-runner alone. Same image as deploy/images/build runner.
#   docker build -f deploy/docker/runner.Dockerfile -t toolrun/runner:0.1.0 .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN RUSTFLAGS='-C target-feature=+crt-static' \
    cargo build --release --target x86_64-unknown-linux-gnu -p toolrun-runner

FROM scratch
COPY --from=build /src/target/x86_64-unknown-linux-gnu/release/toolrun-runner /toolrun-runner
USER 65534:65534
ENTRYPOINT ["/toolrun-runner"]
