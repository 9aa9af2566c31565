# kp — see README.md. Everything here runs as root on a Debian 12 machine
# (CI runs .ci/run); `make test` includes the end-to-end tests in test/e2e,
# which build network namespaces and need root.

GO      ?= go
BIN     := bin/kp
VERSION := $(shell git describe --always --dirty 2>/dev/null || echo dev)
COMMIT  := $(shell git rev-parse HEAD 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)

# make install puts kp in $(DESTDIR)$(PREFIX)/bin with a kp-top link to it
# (kp answers to that name as kp top).
PREFIX  ?= /usr/local
DESTDIR ?=

.PHONY: all build install test lint demo demo-down clean

all: build

# -buildvcs=false: the version is stamped above, and Go's own VCS stamping
# fails outright in a checkout owned by another user.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/kp

install: build
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/kp
	ln -sfn kp $(DESTDIR)$(PREFIX)/bin/kp-top

test:
	@if [ "$$(id -u)" != 0 ]; then echo "make test: not root; the end-to-end tests need root and will not run" >&2; fi
	$(GO) test -count=1 -p 2 -timeout 25m ./...

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
