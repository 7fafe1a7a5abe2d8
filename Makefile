# Reversi GitOps. `make demo` tells the story on an embedded control plane; `make test` runs every test; `make build` builds bin/reversi and bin/reversi-gateway.
GO ?= go

# controller-gen writes the deepcopy methods, the CRDs and the RBAC. `go run pkg@version`
# builds it once from the Go module proxy; the go command caches the binary.
CONTROLLER_TOOLS_VERSION ?= v0.23.0
CONTROLLER_GEN ?= $(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)

.PHONY: all build demo test vet fmt-check bench bench-go generate manifests

all: build

build:
	$(GO) build -o bin/reversi .
	$(GO) build -o bin/reversi-gateway ./cmd/reversi-gateway

## demo: the story on an embedded control plane (hack/demo, internal/demo): builds what it
## needs, prints every kubectl/git/reversi command it runs, stops everything it started.
demo:
	$(GO) run ./hack/demo

## test: formatting, vet, and every test (unit, fuzz seed corpora, CLI end to end, envtest).
## The envtest control plane (kube-apiserver, etcd, kubectl) comes from hack/setup-envtest.sh,
## which builds it once into a cache outside the repository. The real MCP servers (npm, pinned in
## test/upstreams/package-lock.json) come from hack/upstreams.sh (npm ci into test/upstreams/node_modules).
## Flux's source-controller and kustomize-controller come from hack/setup-flux.sh (built once from
## their modules into the same cache, before go test: the first build outlasts a test's timeout).
test: fmt-check vet
	@hack/system-packages.sh && \
	assets=$$(hack/setup-envtest.sh) && \
	echo "KUBEBUILDER_ASSETS=$$assets" && \
	flux=$$(hack/setup-flux.sh) && \
	echo "REVERSI_FLUX=$$flux" && \
	upstreams=$$(hack/upstreams.sh) && \
	echo "REVERSI_UPSTREAMS=$$upstreams" && \
	KUBEBUILDER_ASSETS="$$assets" REVERSI_FLUX="$$flux" REVERSI_UPSTREAMS="$$upstreams" $(GO) test -count=1 ./...

## generate: the deepcopy methods of api/v1alpha1 (zz_generated.deepcopy.go).
generate:
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

## manifests: the CRDs (config/crd/bases), the manager's RBAC (config/rbac/role.yaml, from
## the +kubebuilder:rbac markers in controllers/), the webhook configurations
## (config/webhook/manifests.yaml, from the +kubebuilder:webhook markers) and the same RBAC as
## Roles for config/namespaced (hack/namespaced-rbac, from config/rbac).
manifests:
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd webhook paths=./api/... paths=./controllers/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac \
		output:webhook:artifacts:config=config/webhook
	$(GO) run ./hack/namespaced-rbac config

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(find . -name '*.go' -not -path '*/node_modules/*')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

## bench: every figure of issues 10 and 20 side by side with its baseline: the gateway against the floor
## relay, a naive go-sdk proxy, mcp-proxy and supergateway (npm), at 1/16/64 sessions, 3 repetitions,
## then reconcile, reload, PR→enforcement, approvals, verify; writes BENCHMARKS.md (about 10 minutes).
bench:
	upstreams=$${REVERSI_UPSTREAMS:-$$(hack/upstreams.sh)} && assets=$${KUBEBUILDER_ASSETS:-$$(hack/setup-envtest.sh)} && \
	REVERSI_UPSTREAMS="$$upstreams" KUBEBUILDER_ASSETS="$$assets" $(GO) run ./hack/bench suite

## bench-go: the earlier go test benchmarks (manifest validation, registry load, Reconcile5000, GatewayCall).
bench-go:
	$(GO) test -run '^$$' -bench . -benchmem -count 3 ./api/manifest/ ./pkg/registry/
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh)" $(GO) test -run '^$$' -bench Reconcile5000 -benchmem -benchtime 3x ./controllers/
	upstreams=$$(hack/upstreams.sh) && \
	REVERSI_UPSTREAMS="$$upstreams" $(GO) test -run '^$$' -bench GatewayCall -benchtime 1000x ./gateway/proxy/
