# toolrun/sandbox: python3, node and bash from Debian packages, for running as uid 65534 with
# a read-only root (the pod mounts a writable /tmp). Same packages as deploy/images/build sandbox.
#   docker build -f deploy/docker/sandbox.Dockerfile -t toolrun/sandbox:0.1.0 .
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends bash python3 nodejs ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /usr/share/doc/* /usr/share/man/* /usr/share/info/* \
 && chmod 1777 /tmp
ENV HOME=/tmp LANG=C.UTF-8
WORKDIR /tmp
USER 65534:65534
CMD ["/bin/bash"]
