# flashsale-operator

MODULE := github.com/flashsale-dev/flashsale-operator
# The binary's version: the release tag (vX.Y.Z) on a tagged commit, else git
# describe's vX.Y.Z-N-gCOMMIT.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The release the chart, config/manager and dist/install.yaml name: the file
# VERSION. A release bumps it, runs `make manifests`, commits, and tags the
# commit with the same vX.Y.Z.
RELEASE_VERSION := $(shell cat VERSION)
# Image to build with docker-build: tagged with the binary's version, never latest.
IMG ?= flashsale-operator:$(VERSION)
GIT_COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BUILD_DATE ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS := -s -w \
	-X $(MODULE)/internal/version.Version=$(VERSION) \
	-X $(MODULE)/internal/version.GitCommit=$(GIT_COMMIT) \
	-X $(MODULE)/internal/version.BuildDate=$(BUILD_DATE)

# Directories that hold generated files; `verify` fails if regenerating
# changes anything in them.
GENERATED_DIRS := api config controllers charts dist docs/reference.md
CHART := charts/flashsale-operator

# Tools are installed here.
LOCALBIN ?= $(CURDIR)/bin
CONTROLLER_TOOLS_VERSION ?= v0.23.0
# The binary name carries its version, so bumping the version reinstalls it;
# bin/controller-gen is a symlink to the current one.
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)

CONTAINER_TOOL ?= docker

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: controller-gen envtest ## Generate the CRD, the manager's ClusterRole, the chart's copies of them, dist/install.yaml and docs/reference.md.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./..." output:crd:artifacts:config=config/crd/bases
	@# The chart carries the generated CRDs and the manager's rules, and
	@# names the release in VERSION.
	rm -f $(CHART)/crds/*.yaml
	cp config/crd/bases/*.yaml $(CHART)/crds/
	cp config/rbac/role.yaml $(CHART)/files/manager-role.yaml
	sed -i -E 's/^version: .*/version: $(RELEASE_VERSION:v%=%)/; s/^appVersion: .*/appVersion: $(RELEASE_VERSION)/' $(CHART)/Chart.yaml
	sed -i -E 's/^(  newTag:) .*/\1 $(RELEASE_VERSION)/' config/manager/kustomization.yaml
	$(MAKE) --no-print-directory build-installer
	@# docs/reference.md: the FlashSale API reference, from the Go types.
	"$$(hack/build-tool.sh crd-ref-docs | tail -1)" --config hack/crd-ref-docs.yaml --source-path api/v1alpha1 \
		--renderer markdown --output-path docs/reference.md --log-level ERROR

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./..."

.PHONY: fmt
fmt: ## Run go fmt.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet.
	go vet ./...

.PHONY: lint
lint: ## Run golangci-lint (.golangci.yml), with the Kubernetes API linter on api/.
	"$$(hack/build-tool.sh golangci-lint | tail -1)" run ./...

.PHONY: lint-fix
lint-fix: ## Run golangci-lint and apply the fixes it suggests.
	"$$(hack/build-tool.sh golangci-lint | tail -1)" run --fix ./...

.PHONY: verify
verify: verify-gen verify-tracked lint ## Fail if a generated file is stale or untracked, a tracked file is over 1 MiB, or the lint finds anything.

.PHONY: verify-tracked
verify-tracked: ## Fail if git tracks a file over 1 MiB (a built binary, a dump): every source file here is far smaller.
	@big="$$(git ls-files --format='%(objectname) %(path)' | git cat-file --batch-check='%(objectsize) %(rest)' | awk '$$1 > 1048576 { sub(/^[0-9]+ /, ""); print }')"; \
	if [ -n "$$big" ]; then \
		echo "$$big"; \
		echo; \
		echo "ERROR: git tracks the files above, each over 1 MiB (built binaries?)."; \
		echo "       Remove them with 'git rm --cached' and ignore them."; \
		exit 1; \
	fi

.PHONY: verify-gen
verify-gen: manifests generate ## Regenerate and fail if any generated file is stale or untracked.
	@if ! git --no-pager diff --exit-code --stat --patch -- $(GENERATED_DIRS); then \
		echo; \
		echo "ERROR: generated files are out of date (diff above)."; \
		echo "       Run 'make manifests generate' and commit the result."; \
		exit 1; \
	fi
	@untracked="$$(git ls-files --others --exclude-standard -- $(GENERATED_DIRS) | grep -E '(^|/)zz_generated\.|^config/crd/bases/|^config/rbac/role\.yaml$$|^charts/flashsale-operator/(crds/|files/manager-role\.yaml$$)|^dist/install\.yaml$$|^docs/reference\.md$$' || true)"; \
	if [ -n "$$untracked" ]; then \
		echo "$$untracked"; \
		echo; \
		echo "ERROR: generated files above are not tracked by git."; \
		echo "       Add and commit them (or delete them if they are obsolete)."; \
		exit 1; \
	fi
	@echo "verify: generated files are up to date."

.PHONY: verify-mod
verify-mod: ## Fail if go.mod or go.sum differ from what `go mod tidy` writes.
	@go mod tidy -diff || { echo; echo "ERROR: go.mod/go.sum are not tidy (diff above). Run 'go mod tidy' and commit the result."; exit 1; }

.PHONY: verify-test
verify-test: controller-gen ## Show that verify passes on a clean copy of the tree and fails after a hand-edit.
	LOCALBIN="$(LOCALBIN)" hack/verify-test.sh

.PHONY: deps
deps: ## Install the system packages the tests need (when missing).
	hack/install-deps.sh

.PHONY: envtest
envtest: ## Build the kube-apiserver and etcd test binaries (cached).
	hack/build-envtest.sh

.PHONY: kube-node
kube-node: ## Build the test node's kubelet, kube-controller-manager, kube-scheduler and kube-proxy (cached).
	hack/build-kube-node.sh

.PHONY: demo
demo: ## Run a whole flash sale on this machine: local cluster, operator, storm, audit (DEMO_FLAGS=--keep keeps it up).
	go run ./hack/demo $(DEMO_FLAGS)

.PHONY: bench
bench: deps bench-rebuild bench-ledger bench-sweep ## Run the benchmarks of docs/benchmarks.md, docs/capacity.md, docs/rebuild-benchmarks.md and docs/sweeper.md (about an hour: the reservation storms 25–30 minutes, the rebuild and the ledger beside old sales about 15 each, the sweep under a minute); BENCH_ARGS="--json": the storms' report as JSON (after the other tables).
	go run ./hack/bench $(BENCH_ARGS)

.PHONY: bench-rebuild
bench-rebuild: deps ## Rebuild after a Redis loss at 100k, 1M and 10M orders (REBUILD_ARGS="--orders 100000" for fewer).
	go run ./hack/rebuildbench $(REBUILD_ARGS)

.PHONY: bench-sweep
bench-sweep: deps ## The sweeper draining 20,000 expired reservations, with 0 and 1 ms added to each Redis reply, every buyer at home or half of them stolen, then the ledger's cancel of 20,000 alone, in PostgreSQL's CPU (docs/sweeper.md).
	go test -run '^$$' -bench Sweep -benchtime 20000x ./runtime/engine/
	go test -run '^$$' -bench CancelExpiredPostgresCPU -benchtime 20000x ./runtime/ledger/

.PHONY: bench-ledger
bench-ledger: deps ## A new sale's ledger queries beside 10 finished sales of 1M orders each, bytes per order, 0002's insert cost (LEDGER_ARGS="--old-orders 100000" for less).
	go run ./hack/ledgerbench $(LEDGER_ARGS)

.PHONY: tools
tools: ## Build helm, promtool, crd-ref-docs and golangci-lint from their Go modules, and fetch the Prometheus Operator's CRDs (cached).
	hack/build-tool.sh helm
	hack/build-tool.sh promtool
	hack/build-tool.sh crd-ref-docs
	hack/build-tool.sh golangci-lint
	hack/build-tool.sh monitoring-crds

# -timeout: go test's default, 10 minutes a package, is shorter than test/node's
# first run (its image build alone took 263 s on two busy cores, then ~10 cases).
.PHONY: test
test: deps envtest kube-node tools ## Install what is missing, build the envtest and test node binaries and the tools, run every test.
	KUBEBUILDER_ASSETS="$$(hack/build-envtest.sh | tail -1)" FLASHSALE_KUBE_NODE="$$(hack/build-kube-node.sh | tail -1)" go test -race -count=1 -timeout 40m ./...
	go vet ./...
	$(MAKE) --no-print-directory verify-mod
	@unformatted="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$unformatted" ]; then \
		echo "gofmt would change: $$unformatted (run make fmt)"; exit 1; fi
	$(MAKE) --no-print-directory verify-test

##@ Build

.PHONY: build-installer
build-installer: envtest ## Write dist/install.yaml (CRDs, RBAC, manager) from config/default, for kubectl apply --server-side -f.
	mkdir -p dist
	{ echo "# flashsale-operator $(RELEASE_VERSION): generated by make build-installer from config/default."; \
	  echo "# kubectl apply --server-side -f dist/install.yaml"; \
	  "$$(hack/build-envtest.sh | tail -1)/kubectl" kustomize config/default; } >dist/install.yaml

.PHONY: build
build: ## Build bin/flashsale.
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o $(LOCALBIN)/flashsale ./cmd/flashsale

.PHONY: docker-build
docker-build: ## Build the container image.
	$(CONTAINER_TOOL) build \
		--build-arg VERSION=$(VERSION) \
		--build-arg GIT_COMMIT=$(GIT_COMMIT) \
		--build-arg BUILD_DATE=$(BUILD_DATE) \
		-t $(IMG) .

##@ Tools

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN) ## Install controller-gen into bin/.
$(CONTROLLER_GEN):
	mkdir -p $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv -f $(LOCALBIN)/controller-gen $(CONTROLLER_GEN)
	ln -sf $(notdir $(CONTROLLER_GEN)) $(LOCALBIN)/controller-gen
