# One image for every `reversi` command (the controller and the gateway arrive in later releases).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/reversi . && \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/reversi-gateway ./cmd/reversi-gateway

# A static binary on an empty base; CA certificates for https upstreams and git remotes.
FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/
COPY --from=build /out/reversi /reversi
# The gateway on its own name: `docker run --entrypoint /reversi-gateway ...`.
COPY --from=build /out/reversi-gateway /reversi-gateway
USER 65532:65532
ENTRYPOINT ["/reversi"]
