# One image for every `reversi` command: `reversi controller`, `reversi gateway`,
# `reversi version`. A static binary on an empty base, non-root.
#
#   docker build .                     builds everything from source (the default)
#   docker build --build-arg BINARY=prebuilt -f Dockerfile CONTEXT
#                                      takes CONTEXT/bin/image/{reversi,ca-certificates.crt}
#                                      instead (a static binary built on the host with
#                                      CGO_ENABLED=0): no base image is pulled at all. The image
#                                      test (test/image) builds this way with buildah.
ARG BINARY=build

# From source: a static binary (CGO_ENABLED=0; SQLite is modernc.org/sqlite, pure Go).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN mkdir -p /out/etc/ssl/certs && \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/reversi . && \
    cp /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/

# From the build context: the same layout, prepared by the caller.
FROM scratch AS prebuilt
COPY bin/image/reversi /out/reversi
COPY bin/image/ca-certificates.crt /out/etc/ssl/certs/ca-certificates.crt

FROM ${BINARY} AS binary

# The runtime: nothing but the binary and the CA certificates (for https upstreams and git
# remotes).
FROM scratch
COPY --from=binary /out/reversi /reversi
COPY --from=binary /out/etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
# nonroot (65532), numeric so that runAsNonRoot can check it without an /etc/passwd.
USER 65532:65532
ENTRYPOINT ["/reversi"]
