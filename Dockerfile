# syntax=docker/dockerfile:1
#
# Two images from one build, each with one static binary:
#   webhook (the default target)  /usr/local/bin/dislock        the admission webhook and operator CLI
#   agent   (--target agent)      /usr/local/bin/dislock-agent  the sidecar the webhook injects
# The agent image is the webhook's --agent-image. It runs in every opted-in pod, where a tenant
# may exec into the sidecar, so it holds nothing but dislock-agent: not the operator CLI, which
# would work there with the sidecar's database credential (`dislock leases`). The injected
# sidecar runs `dislock-agent agent` from the PATH, and copies itself into the pod's shared
# volume, mounted at /dislock, for the app containers. Nothing may live at /dislock in the image
# (a binary there would be shadowed, a file would block the mount).
#
#   make docker-build IMG=ghcr.io/dislock/dislock:v1.0.0 AGENT_IMG=ghcr.io/dislock/dislock-agent:v1.0.0
#   docker buildx build --platform linux/amd64,linux/arm64 -t IMG .                          # multi-arch
#   docker buildx build --platform linux/amd64,linux/arm64 --target agent -t AGENT_IMG .

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS source
ARG TARGETOS=linux
ARG TARGETARCH
ENV CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH}
WORKDIR /src
# Modules first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY main.go ./
COPY internal/ internal/
COPY lockagent/ lockagent/
COPY webhook/ webhook/
# After the module download, so that a new commit does not invalidate it.
ARG VERSION=dev
ARG COMMIT=unknown
ENV LDFLAGS="-s -w -X github.com/dislock/dislock/internal/version.Version=${VERSION} -X github.com/dislock/dislock/internal/version.Commit=${COMMIT}"

# Static (CGO_ENABLED=0, so no libc in the image), reproducible (-trimpath), stripped (-s -w:
# the agent is copied into every pod and must stay under 15 MB). One stage per binary, so that
# --target agent builds only the agent.
FROM source AS build-agent
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags "$LDFLAGS" -o /out/dislock-agent ./lockagent/cmd/dislock-agent

FROM source AS build-webhook
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags "$LDFLAGS" -o /out/dislock .

# distroless/static: CA certificates (TLS to the database and registries), /etc/passwd with the
# nonroot user (65532, the uid the injected sidecar runs as), no shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot AS agent
COPY --from=build-agent /out/dislock-agent /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/dislock-agent"]

# The last stage is the default target.
FROM gcr.io/distroless/static-debian12:nonroot AS webhook
COPY --from=build-webhook /out/dislock /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/dislock"]
