# syntax=docker/dockerfile:1
# pushd image: a static binary on distroless, run as a non-root user.
#
#   docker build --build-arg VERSION=v1.2.3 --build-arg COMMIT=$(git rev-parse HEAD) -t pushd .
#
# No Docker engine is reachable where pushd is developed, so this file is
# checked by deploy/deploy_test.go (parsed, stages and settings asserted),
# not built there.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Modules first: this layer and the cache mounts survive source edits.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
# .git is not in the context (.dockerignore), so the version and commit
# come from build args; -trimpath keeps build paths out of the binary.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/pushd ./cmd/pushd

# distroless static carries CA certificates (for rediss:// and TLS to
# PostgreSQL), tzdata and a nonroot user, and no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/pushd /pushd
USER 65532:65532
EXPOSE 8080
ENV PUSHD_LISTEN=:8080 PUSHD_LOG_FORMAT=json
# No HEALTHCHECK: the image has no shell or curl to run one. Probe
# GET /healthz (liveness) and GET /readyz (readiness) from the
# orchestrator: Kubernetes probes, the load balancer, or Compose's
# depends_on of the balancer.
ENTRYPOINT ["/pushd"]
