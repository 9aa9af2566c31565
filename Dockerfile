# kp's image: one static binary, plus the iptables (both backends) and ipset
# tools only because kp's legacy modes drive iptables-restore and ipset (the
# default nftables mode talks netlink and needs no tool).
# manifests/daemonset.yaml runs /usr/local/bin/kp from it.
#
#   docker build -t registry.example/kp:v0.1.0 --build-arg VERSION=v0.1.0 \
#     --build-arg COMMIT=$(git rev-parse HEAD) \
#     --build-arg DATE=$(TZ=UTC0 git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ) .
#
# `make image` builds the same image without Docker or a registry
# (test/image: KP), from the same Debian 12 packages; a test there checks the
# two agree (entrypoint, command, where kp goes, the kp-top link, the
# packages installed). Change both together.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
# Everything but what .dockerignore leaves out (tests, manifests, .git).
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
# The commit's date (RFC 3339, UTC), as make build stamps it.
ARG DATE=unknown
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT} -X main.date=${DATE}" \
      -o /out/kp ./cmd/kp

FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables ipset \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/kp /usr/local/bin/kp
# kp answers to kp-top as kp top: kubectl exec ... -- kp-top
RUN ln -s kp /usr/local/bin/kp-top
ENTRYPOINT ["/usr/local/bin/kp"]
CMD ["proxy", "--help"]
