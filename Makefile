# kp — see README.md. Everything here runs as root on a Debian 12 machine
# (CI runs .ci/run); `make test` includes the end-to-end tests in test/e2e,
# which build network namespaces and need root, and the tests against a real
# kube-apiserver, whose binaries `make kube-bins` builds (and caches) first.

GO      ?= go
BIN     := bin/kp
VERSION := $(shell git describe --always --dirty 2>/dev/null || echo dev)
COMMIT  := $(shell git rev-parse HEAD 2>/dev/null || echo dev)
# The commit's date, not now: two builds of one commit are the same file.
DATE    := $(shell TZ=UTC0 git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.date=$(DATE)

# make install puts kp in $(DESTDIR)$(PREFIX)/bin with a kp-top link to it
# (kp answers to that name as kp top).
PREFIX  ?= /usr/local
DESTDIR ?=

.PHONY: all build image release install test fuzz lint demo demo-down clean kube-bins test-images conformance-bins bench bench-vm conformance vm-kernel

all: build

# -buildvcs=false: the version is stamped above, and Go's own VCS stamping
# fails outright in a checkout owned by another user.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/kp

# kp's container image without Docker or a registry: bin/kp, the kp-top link
# and the iptables (both backends) and ipset tools from Debian 12 packages
# (apt-get download; cached in $KP_IMAGE_CACHE, default ~/.cache/kp-image),
# written by test/image/cmd/kp-image as a Docker-format tarball that
# `ctr -n k8s.io images import`, `docker load` and `kind load image-archive`
# take. The same image as the Dockerfile's. Prints the tarball's path, the
# image's digest and the size. IMAGE names it.
IMAGE       ?= kp.local/kp:$(VERSION)
IMAGE_TAR   := bin/kp-image.tar
image: build
	$(GO) run ./test/image/cmd/kp-image -kp $(BIN) -ref $(IMAGE) -o $(IMAGE_TAR)

# A release of the commit checked out, into DIST (default dist/): static kp
# binaries for linux/amd64 and linux/arm64, the image for both as one OCI
# image index tarball (as make image builds it, from each architecture's
# Debian 12 packages), a CycloneDX SBOM of each, manifests/ rendered with
# the image pinned to the index's digest (IMAGE_REPO@sha256:...), and
# SHA256SUMS. Reproducible: the same commit, Go and Debian packages give
# the same files. Refuses a checkout with uncommitted changes. See
# docs/release.md; test/release builds one twice and compares.
#
#   make release VERSION=v0.1.0 [IMAGE_REPO=ghcr.io/kpproxy/kp]
IMAGE_REPO ?= ghcr.io/kpproxy/kp
DIST       ?= dist
release:
	$(GO) run ./test/release/cmd/kp-release -version '$(VERSION)' -image-repo '$(IMAGE_REPO)' -o '$(DIST)'

install: build
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/kp
	ln -sfn kp $(DESTDIR)$(PREFIX)/bin/kp-top

# The real kube-apiserver, kubectl, kube-proxy, etcd and, for the real-node
# tests, kube-controller-manager, kube-scheduler and kubelet, built from
# test/k8s (a nested module) into a cache outside the repository, keyed by
# their versions: about 15 minutes cold on 2 cores (the three node binaries
# add 3-6 minutes to the API server's 10), a second when cached.
# KP_KUBE_CACHE moves the cache (default ~/.cache/kp-test).
kube-bins:
	GO=$(GO) bash test/k8s/build.sh

# The container images the real-node tests run, as tarballs for `ctr images
# import`: a minimal CoreDNS (kp.local/coredns) and agnhost, busybox and pause
# under the names upstream's e2e framework uses. Same cache as kube-bins,
# keyed by versions and a hash of their sources; see test/k8s/images.sh for
# the host tools it needs. 2–3 minutes after kube-bins (whose packages
# agnhost shares) plus CoreDNS's first build (5.5 min of 2 cores from an empty
# build cache, 320 s of CPU); under a second when cached.
test-images:
	GO=$(GO) bash test/k8s/images.sh

# The second kernel test/vm boots under qemu (the host's has no IPVS):
# Debian 12's linux-image-cloud-amd64 (6.1), apt-get download + dpkg -x
# into the same cache (never the host's /boot). 20 s once (27 MB), 4 s when
# cached (apt-cache reads the lists). Needs apt-get update run once.
vm-kernel:
	bash test/vm/kernel.sh

# Upstream's e2e.test and the ginkgo CLI, for running upstream's conformance
# and [sig-network] tests against kp; not needed by make test.
conformance-bins:
	GO=$(GO) bash test/k8s/conformance-bins.sh

# -parallel 4: the end-to-end tests run each feature once per mode, in
# worlds that mostly wait on packets and timeouts (about a third of 2 cores
# at 4); more gets CPU-bound on the kube tests' API servers.
#
# The whole output is also written to TEST_LOG; when a test fails, the
# last thing printed is test/failures.sh's digest of it (the failed tests
# and their last messages), since a failing end-to-end test's process logs
# fill the end of the output.
#
# go test runs with -json, and test/skips prints what a plain go test would
# (into TEST_LOG too), keeping every event, passing tests' logs included, in
# TEST_LOG.json; then its skip ledger: how many tests skipped and why, and
# under CI (CI set) a failure on any skip test/skips.allow does not name
# with its reason.
#
# First, charts/kp's tests (helm lint, the defaults against manifests/, each
# value, the packaged chart), through Helm's Go module in test/helm, a module
# of its own that ./... does not reach; they also build what test/nodes'
# kp-chart needs. About 2 minutes cold (compiling Helm), seconds warm.
TEST_LOG ?= /tmp/kp-make-test.log
test: kube-bins test-images vm-kernel
	@if [ "$$(id -u)" != 0 ]; then echo "make test: not root; the end-to-end tests need root and will not run" >&2; fi
	cd test/helm && $(GO) test -count=1 ./...
	$(GO) build -o /tmp/kp-test-skips ./test/skips
	bash -o pipefail -c '$(GO) test -json -count=1 -p 2 -parallel 4 -timeout 45m ./... 2>&1 | /tmp/kp-test-skips -log $(TEST_LOG) -json $(TEST_LOG).json' || \
		{ /tmp/kp-test-skips -ledger $(TEST_LOG).json -allow test/skips.allow || true; bash test/failures.sh $(TEST_LOG); exit 1; }
	/tmp/kp-test-skips -ledger $(TEST_LOG).json -allow test/skips.allow
	$(MAKE) fuzz

# The benchmark of kp against upstream kube-proxy (nftables and iptables
# modes) against one real kube-apiserver: rewrites test/bench/REPORT.md,
# bench.svg and results.json. Not part of `make test`, which runs only its
# smoke (TestBenchSmoke, N = 100) and its regression gate (TestBenchGate:
# kp at N = 1,000 in under a minute, budgets in test/bench/gate_test.go,
# peak RSS against test/bench/gate.json; NOTES.md "The regression gate"). BENCH_N lists the Service counts;
# BENCH_ARGS passes more flags (see test/bench). The five proxies run up to
# 10,000, and the iptables modes through iptables-legacy (kp-iptables-legacy,
# upstream-iptables-legacy) up to 1,000 (-bench.no-legacy=10000: at 10,000
# they would add 18 minutes); from 30,000 on kp's nftables mode and upstream's alone
# (kp-iptables at 30,000 alone would take over an hour), at 100,000 kp
# alone; upstream's cold starts get at most 6 minutes from 10,000 on (one
# that runs into it ends that proxy's rounds there, and its rows are
# misses). One run, at one commit: every proxy and reference of an N is
# measured in interleaved rounds, at least 5 and up to 12 while a paired
# ratio's 95 % interval is wider than ±10 % (test/bench/rule.go); the run's
# time budget, computed from that rule and the cold starts of the last
# report before it starts, is printed first and in the report (3 h 17 min
# for the default run, 17 min of it the restart and take-over phases at 10,000,
# 12 min the paths a user hits at 10,000, 17 min the iptables-legacy pair), and no round past the minimum is begun once an
# N's share is spent. The API server is populated through its etcd
# (seconds, even at 100,000). BENCH_N=1,1000,10000 is the short run.
# At 10,000 (-bench.churn.n) kp, upstream-nft and upstream-iptables each
# get churn phases (issue 35): 5 minutes (-bench.churn.duration) at 50 and
# at 200 EndpointSlice changes a second (-bench.churn.rates), each change
# timed from its API write to the kernel event naming it, with
# --min-sync-period 0 (-bench.churn.min-sync-period): 21 minutes of the
# budget (upstream-iptables, expected to run into its cold-start limit
# at 10,000, is not counted). The iptables-legacy pair has none: a churn
# change is timed to its nf_tables event, and x_tables writes none.
BENCH_N    ?= 1,1000,10000,30000,100000
BENCH_ARGS ?= -bench.big=10000 -bench.big.changes=20 -bench.big.timeout=6m -bench.nft-only=30000 -bench.kp-only=100000 -bench.no-legacy=10000
bench: kube-bins
	$(GO) test -count=1 -timeout 4h -run '^TestBench$$' -v ./test/bench/ -args -bench.n=$(BENCH_N) $(BENCH_ARGS)

# kp's ipvs mode against upstream's (issue 15), on the VM's kernel (test/vm:
# Debian 12's 6.1, which has IPVS, under qemu in software emulation, so only
# the ratios count): TestBench runs in the VM with the kp-ipvs and
# upstream-ipvs proxies, and test/bench/vm/REPORT.md, bench.svg and
# results.json are rewritten. BENCH_VM_ARGS passes more TestBench flags
# (e.g. -bench.rounds=1-2 -bench.changes=20). BENCH_VM_SEED=1 populates each
# N's API server on the host and boots the VM once per N on a copy of its
# etcd data (populating under emulation is the slow part). Not part of
# `make test`.
BENCH_VM_N    ?= 1000,10000
BENCH_VM_ARGS ?=
BENCH_VM_SEED ?=
bench-vm: kube-bins vm-kernel
	$(GO) test -count=1 -timeout 5h -run '^TestBenchInTheVM$$' -v ./test/bench/ -args -bench.vm.n=$(BENCH_VM_N) \
		-bench.vm.args='$(BENCH_VM_ARGS)' -bench.vm.seed=$(if $(BENCH_VM_SEED),true,false)

# Upstream's own Services tests (e2e.test v1.36.3 under ginkgo, 4 parallel
# processes) on a real 3-node cluster, once with upstream kube-proxy in
# nftables mode and once with kp's DaemonSet, each on a fresh cluster:
# rewrites test/conformance/REPORT.md and results.json, keeps the logs in
# bin/conformance/. About 25 minutes on 2 cores. Not part of `make test`.
# CONFORMANCE_MODES picks columns (e.g. kp-nftables).
CONFORMANCE_MODES ?=
conformance: kube-bins
	KP_CONFORMANCE=1 KP_CONFORMANCE_MODES=$(CONFORMANCE_MODES) $(GO) test -count=1 -timeout 3h -run '^TestConformance$$' -v ./test/conformance/

# The fuzz targets: manifest bytes through the decoder, the change tracker
# and each backend on its fake kernel (an incremental sync must equal a fresh
# render of the same State: test/fuzzsync), the --config file, the status
# API's requests, the Node annotations kp and kp migrate cluster read, and
# the snapshot files kp explain reads.
# `go test -fuzz` takes one target of one package at a time, so each runs
# for FUZZTIME in turn (9 targets of 7 s: about a minute in all);
# `make test` (and so CI) runs them all. A failing input is saved under the
# package's testdata/fuzz/<FuzzName>/ and replayed by every later plain
# `go test`, beside the committed seeds (go run ./test/fuzzsync/seedcorpus).
FUZZTIME ?= 7s
FUZZ_TARGETS = FuzzManifestToNFT:./nft/ FuzzManifestToIPTables:./legacy/iptables/ FuzzManifestToIPVS:./legacy/ipvs/ \
	FuzzManifestToUserspace:./legacy/userspace/ FuzzConfigFile:./cmd/kp/options/ \
	FuzzMigrationRequest:./proxy/server/ FuzzServicesQuery:./proxy/server/ FuzzNodeAnnotations:./migrate/ \
	FuzzSnapshot:./explain/ FuzzRulePath:./nft/
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz: $${t%%:*} for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$${t%%:*}\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 1s -parallel 2 "$${t#*:}"; \
	done

lint:
	@files="$$(gofmt -l $$(find . -name '*.go' -not -path './.git/*'))"; \
	if [ -n "$$files" ]; then echo "gofmt: these files need formatting (run gofmt -w):"; echo "$$files"; exit 1; fi
	$(GO) vet ./...

demo:
	bash scripts/demo.sh

demo-down:
	bash scripts/demo-down.sh

clean:
	rm -rf bin coverage.out coverage.html
