# Reversi GitOps. `make test` runs every test; `make build` builds bin/reversi.
GO ?= go

.PHONY: all build test vet fmt-check bench

all: build

build:
	$(GO) build -o bin/reversi .

## test: formatting, vet, and every test (unit, fuzz seed corpora, CLI end to end).
test: fmt-check vet
	$(GO) test -count=1 ./...

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(find . -name '*.go' -not -path '*/node_modules/*')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

## bench: the benchmarks recorded in BENCHMARKS.md.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./api/manifest/
