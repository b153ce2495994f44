# toolrun/gateway: the toolrun binary with only the shared libraries it loads, as uid 65534.
# Same image as deploy/images/build gateway.
#   docker build -f deploy/docker/gateway.Dockerfile -t toolrun/gateway:0.1.0 .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p toolrun \
 && mkdir -p /out/usr/local/bin /out/etc /out/tmp && chmod 1777 /out/tmp \
 && cp target/release/toolrun /out/usr/local/bin/ \
 && for lib in $(ldd target/release/toolrun | grep -o '/[^ ]*' | sort -u); do \
      mkdir -p "/out$(dirname "$lib")" && cp -L "$lib" "/out$lib"; done \
 && printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' > /out/etc/passwd \
 && printf 'root:x:0:\nnogroup:x:65534:\n' > /out/etc/group

FROM scratch
COPY --from=build /out/ /
ENV PATH=/usr/local/bin:/usr/bin:/bin
USER 65534:65534
WORKDIR /tmp
ENTRYPOINT ["/usr/local/bin/toolrun"]
