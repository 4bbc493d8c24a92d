# syntax=docker/dockerfile:1
#
# Two images, each with one static binary:
#   webhook (the default target)  /usr/local/bin/dislock        the admission webhook and operator CLI
#   agent   (--target agent)      /usr/local/bin/dislock-agent  the sidecar the webhook injects
#
# What goes into them is decided once, in internal/image (the recipe): the build flags, the
# files (binary, /etc/passwd and /etc/group with nonroot 65532, CA certificates, /tmp) and the
# config. `make image` builds the same images from it without a Docker daemon, and the e2e
# tests run those. Here a build stage runs the recipe (cmd/dislock-image rootfs) to lay out each
# image's root filesystem, and a FROM scratch stage copies it; the USER, ENV, ENTRYPOINT and
# LABEL lines repeat the recipe's config, and internal/image's tests fail when they disagree.
#
# The agent image is the webhook's --agent-image. It runs in every opted-in pod, where a tenant
# may exec into the sidecar, so it holds nothing but dislock-agent: not the operator CLI. Nothing
# may live at /dislock in either image (the pod's shared volume is mounted there).
#
#   make docker-build IMG=ghcr.io/dislock/dislock:v1.0.0 AGENT_IMG=ghcr.io/dislock/dislock-agent:v1.0.0
#   docker buildx build --platform linux/amd64,linux/arm64 -t IMG .                          # multi-arch
#   docker buildx build --platform linux/amd64,linux/arm64 --target agent -t AGENT_IMG .

ARG GO_VERSION=1.26.8

# The build runs on the build machine's platform and cross-compiles (CGO_ENABLED=0) for the
# target's: no emulation for multi-arch builds. The golang image is Debian: its ca-certificates
# bundle is the one the recipe copies.
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS source
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
ARG TARGETOS=linux
ARG TARGETARCH
ENV RECIPE="go run ./internal/image/cmd/dislock-image rootfs -version=${VERSION} -commit=${COMMIT} -os=${TARGETOS} -arch=${TARGETARCH}"

# One stage per image, so that --target agent builds only the agent.
FROM source AS rootfs-agent
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    $RECIPE -target=agent /rootfs

FROM source AS rootfs-webhook
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    $RECIPE -target=webhook /rootfs

FROM scratch AS agent
ARG VERSION=dev
ARG COMMIT=unknown
COPY --from=rootfs-agent /rootfs/ /
USER 65532:65532
ENV PATH=/usr/local/bin:/usr/bin:/bin
LABEL org.opencontainers.image.version=${VERSION} org.opencontainers.image.revision=${COMMIT} org.opencontainers.image.source=https://github.com/dislock/dislock
ENTRYPOINT ["/usr/local/bin/dislock-agent"]

# The last stage is the default target.
FROM scratch AS webhook
ARG VERSION=dev
ARG COMMIT=unknown
COPY --from=rootfs-webhook /rootfs/ /
USER 65532:65532
ENV PATH=/usr/local/bin:/usr/bin:/bin
LABEL org.opencontainers.image.version=${VERSION} org.opencontainers.image.revision=${COMMIT} org.opencontainers.image.source=https://github.com/dislock/dislock
ENTRYPOINT ["/usr/local/bin/dislock"]
