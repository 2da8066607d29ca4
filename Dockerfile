# Build the flashsale binary.
FROM golang:1.26 AS builder
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
ARG GIT_COMMIT=unknown
ARG BUILD_DATE=unknown

WORKDIR /workspace
# Download modules in their own layer so that source changes reuse it.
COPY go.mod go.sum ./
RUN go mod download

COPY . .
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath \
    -ldflags "-s -w \
      -X github.com/flashsale-dev/flashsale-operator/internal/version.Version=${VERSION} \
      -X github.com/flashsale-dev/flashsale-operator/internal/version.GitCommit=${GIT_COMMIT} \
      -X github.com/flashsale-dev/flashsale-operator/internal/version.BuildDate=${BUILD_DATE}" \
    -o /flashsale ./cmd/flashsale

# One static binary on a distroless base, as a non-root user. The role is the
# first argument: manager, reserve, sweeper, ...
FROM gcr.io/distroless/static:nonroot
COPY --from=builder /flashsale /flashsale
USER 65532:65532
ENTRYPOINT ["/flashsale"]
