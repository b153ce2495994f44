# toolrun/sandbox: python3 (with numpy, pandas, matplotlib, scipy), node, bash, gcc and esbuild
# from Debian packages, for running as uid 65534 with
# a read-only root (the pod mounts a writable /tmp), and the static toolrun-runner at
# /usr/local/bin/toolrun-runner (so the operator runs it without an init container). Same
# contents as deploy/images/build sandbox.
#   docker build -f deploy/docker/sandbox.Dockerfile -t toolrun/sandbox:0.1.0 .
FROM rust:1-bookworm AS runner
WORKDIR /src
COPY . .
RUN RUSTFLAGS='-C target-feature=+crt-static' \
    cargo build --release --target x86_64-unknown-linux-gnu -p toolrun-runner

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends bash python3 nodejs ca-certificates \
      python3-numpy python3-pandas python3-matplotlib python3-scipy gcc libc6-dev esbuild \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /usr/share/doc/* /usr/share/man/* /usr/share/info/* \
 && chmod 1777 /tmp
COPY --from=runner /src/target/x86_64-unknown-linux-gnu/release/toolrun-runner /usr/local/bin/toolrun-runner
ENV HOME=/tmp LANG=C.UTF-8
WORKDIR /tmp
USER 65534:65534
CMD ["/bin/bash"]
