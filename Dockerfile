# syntax=docker/dockerfile:1
#
# One image, two static binaries:
#   /usr/local/bin/dislock        the admission webhook and operator CLI (`dislock webhook`, ...)
#   /usr/local/bin/dislock-agent  the sidecar the webhook injects into opted-in Jobs
# Both are on the image's PATH: the injected sidecar runs `dislock-agent agent`, and copies itself
# into the pod's shared volume, mounted at /dislock, for the app containers. Nothing may live at
# /dislock in the image (a binary there would be shadowed, a file would block the mount).
#
#   make docker-build IMG=ghcr.io/dislock/dislock:v1.0.0
#   docker buildx build --platform linux/amd64,linux/arm64 -t IMG .   # multi-arch

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
ARG COMMIT=unknown
WORKDIR /src
# Modules first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY main.go ./
COPY internal/ internal/
COPY lockagent/ lockagent/
COPY webhook/ webhook/
# Static (CGO_ENABLED=0, so no libc in the image), reproducible (-trimpath), stripped (-s -w:
# the agent is copied into every pod and must stay under 15 MB).
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    set -eu; \
    ldflags="-s -w -X github.com/dislock/dislock/internal/version.Version=${VERSION} -X github.com/dislock/dislock/internal/version.Commit=${COMMIT}"; \
    export CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH}; \
    go build -trimpath -ldflags "$ldflags" -o /out/dislock . ; \
    go build -trimpath -ldflags "$ldflags" -o /out/dislock-agent ./lockagent/cmd/dislock-agent

# distroless/static: CA certificates (TLS to the database and registries), /etc/passwd with the
# nonroot user (65532, the uid the injected sidecar runs as), no shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/dislock /out/dislock-agent /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/dislock"]
