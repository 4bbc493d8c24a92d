# dislock — run a Kubernetes CronJob at most once per schedule window across clusters.

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X github.com/dislock/dislock/internal/version.Version=$(VERSION) \
           -X github.com/dislock/dislock/internal/version.Commit=$(COMMIT)
BIN     := $(CURDIR)/bin
SHELL   := /bin/bash
GO      ?= go
# Test tiers are found, not listed: hack/test-packages.sh sorts each package
# by what its tests import (unit: no server; db: PostgreSQL and PgBouncer;
# kube: kube-apiserver or Patroni; e2e: real kubelets), and hack/test.sh runs
# them through hack/testreport, which prints failing output, every skipped
# test with its reason, and at the end the time each package took.
TEST := GO=$(GO) hack/test.sh
# What `make tools` builds from the Go module proxy into bin/ (test/tools/build.sh).
TOOLS := kube-apiserver etcd kube-controller-manager kube-scheduler kubelet kubectl helm
FUZZTIME ?= 15s
# make chaos: how many seeded fault schedules, from which seed (0 = random;
# schedule i uses SEED+i, so a printed seed replays with SCHEDULES=1), how
# many at once.
SCHEDULES ?= 2000
SEED      ?= 0
PARALLEL  ?= 3
# The bounded fault-schedule run inside `make test`: a fixed seed, so that
# the gate replays the same plans every time (`make chaos` draws new ones).
TEST_SCHEDULES ?= 100
TEST_SEED      ?= 20261201
# make failover: how many times to kill the primary (make test kills it 10 times).
FAILOVERS ?= 20

.DEFAULT_GOAL := help

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: fmt
fmt: ## Format the Go code.
	gofmt -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## Check formatting and run go vet.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "not gofmt-ed: $$out"; exit 1; fi
	$(GO) vet ./...

.PHONY: deps
deps: ## Install the Debian packages the tests start (PostgreSQL, PgBouncer, libfaketime, Patroni, HAProxy, Prometheus) when missing.
	@hack/install-deps.sh

.PHONY: node-deps
node-deps: ## Install what a real test node runs (containerd, runc, CNI plugins, busybox-static) when missing.
	@hack/install-node-deps.sh

##@ Test

.PHONY: test
test: deps node-deps vet tools ## Run every test against real components, the multi-cluster e2e last, and print each package's time (the CI command; as root).
	CI=true CHAOS_FLAGS='-chaos.schedules=$(TEST_SCHEDULES) -chaos.seed=$(TEST_SEED) -chaos.parallel=$(PARALLEL)' \
		$(TEST) unit+db+kube chaos-slice e2e

.PHONY: test-unit
test-unit: ## Run the tests that start no server (no database, API server or node): quick feedback while editing.
	$(TEST) unit

.PHONY: test-db
test-db: deps ## Run the tests that start PostgreSQL and PgBouncer, and nothing more.
	CI=true $(TEST) db

.PHONY: test-integration
test-integration: deps tools ## Run the tests that start a real kube-apiserver or Patroni (webhook, chart, agent in pods, failover).
	CI=true $(TEST) kube

.PHONY: test-e2e
test-e2e: deps node-deps tools ## Run only the multi-cluster end-to-end tests on real kubelets (as root).
	CI=true $(TEST) e2e

.PHONY: chaos
chaos: deps ## Run SCHEDULES seeded fault schedules (default 2000; SEED=..., PARALLEL=...) against real agents, PgBouncers and PostgreSQL, and check the invariants.
	CI=true $(GO) test -count=1 -v -timeout 0 ./test/chaos/ -run '^TestChaos$$' \
		-chaos.schedules=$(SCHEDULES) -chaos.seed=$(SEED) -chaos.parallel=$(PARALLEL)

# Every fuzz target as <package dir>:<FuzzName>. A target missing here is
# never fuzzed: TestMakeFuzzRunsEveryFuzzTarget (test/repo) fails until the
# list is the Go parser's list of the _test.go files' fuzz targets.
FUZZ_TARGETS = \
	./internal/tokenrecord:FuzzDecode \
	./lockagent/contract:FuzzFromAnnotations \
	./lockagent/contract:FuzzParseAgentEnv \
	./lockagent/contract:FuzzTerminationDecode \
	./lockagent/gateway/client:FuzzDial \
	./lockagent/gateway:FuzzCallBodies \
	./lockagent/store/tenant:FuzzTenantDSN \
	./lockagent/store:FuzzParseDatabaseURL \
	./lockagent/window:FuzzFromJobName \
	./lockagent/window:FuzzParseSchedule \
	./lockagent/window:FuzzParseScheduledTimestamp \
	./lockagent/window:FuzzResolve \
	./webhook/inject:FuzzForgedInjection \
	./webhook/inject:FuzzInject \
	./webhook/inject:FuzzValidateCronJob \
	./webhook/pluginapi:FuzzParse \
	./webhook/registry:FuzzPullSecretKeychain \
	./webhook:FuzzAdmission \
	./webhook:FuzzPatch

.PHONY: fuzz
fuzz: ## Run every fuzz target (FUZZ_TARGETS) for FUZZTIME (default 15s).
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz: $${t#*:} in $${t%%:*}"; \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZTIME) $${t%%:*}/; \
	done

.PHONY: bench
bench: deps $(BIN)/etcd ## Benchmark locks (vs SELECT 1 and pgbench), a decision's and a renewal's calls (vs schema 10's and 9's), a tenant's login, pod decision latency, admission (vs a no-op handler), the ledger's metrics at 10 000 keys × 30 days, and claims on a synchronous Patroni cluster (vs a single PostgreSQL).
	set -o pipefail; CI=true $(GO) test -run '^$$' -bench . -benchtime 4000x -count 3 -timeout 20m ./lockagent/store/ | tee bench-lock.txt
	set -o pipefail; CI=true $(GO) test -run '^$$' -bench . -benchtime 300x -count 3 -timeout 10m ./lockagent/store/tenant/ | tee -a bench-lock.txt
	set -o pipefail; CI=true $(GO) test -run '^$$' -bench '^Benchmark(Decision|ProcessStart)$$' -benchtime 100x -count 3 -timeout 20m ./lockagent/agent/ | tee bench-agent.txt
	set -o pipefail; $(GO) test -run '^$$' -bench 'Admission' -benchtime 3000x -count 3 -timeout 20m ./webhook/ | tee bench-webhook.txt
	set -o pipefail; $(GO) test -run '^$$' -bench 'PullSecretKeychain' -benchtime 10x -count 3 -timeout 20m ./webhook/registry/ | tee -a bench-webhook.txt
	set -o pipefail; CI=true $(GO) test -run '^$$' -bench 'LedgerMetrics' -benchtime 3x -count 1 -timeout 30m ./webhook/maintenance/ | tee -a bench-webhook.txt
	set -o pipefail; CI=true $(GO) test -run '^$$' -bench . -benchtime 2000x -count 3 -timeout 20m ./test/failover/ | tee bench-failover.txt

# make bench-scale: the herd's CronJobs per cluster (one herd each) and each
# PgBouncer's pool per tenant role (docs/benchmarks.md).
HERD_KEYS ?= 100,1000,3000,10000
HERD_POOL ?= 2
START_RUNS ?= 20

.PHONY: bench-scale
bench-scale: deps node-deps tools ## Capacity (≤ 15 min, as root): 3 clusters × HERD_KEYS CronJobs firing at once through their PgBouncers (drain, claim p50/p99, errors, PostgreSQL CPU and WAL), their heartbeats vs pgbench, Job created → app started on a real kubelet with and without dislock, and the pod's decision and admission against their baselines.
	set -o pipefail; CI=true $(GO) test -run '^$$' -bench '^BenchmarkHerd$$' -benchtime 1x -timeout 14m ./lockagent/agent/ -herd.keys=$(HERD_KEYS) -herd.pool=$(HERD_POOL) | tee bench-herd.txt
	set -o pipefail; CI=true $(GO) test -count=1 -timeout 10m -run '^TestStartOverhead' -v ./test/e2e/ -start.runs=$(START_RUNS) | tee bench-start.txt
	set -o pipefail; CI=true $(GO) test -run '^$$' -bench '^Benchmark(Decision|ProcessStart)$$' -benchtime 200x -count 3 -timeout 10m ./lockagent/agent/ | tee bench-decision.txt
	set -o pipefail; $(GO) test -run '^$$' -bench 'Admission$$' -benchtime 3000x -count 3 -timeout 10m ./webhook/ | tee bench-admission.txt

.PHONY: failover
failover: deps $(BIN)/etcd ## Kill a Patroni cluster's primary FAILOVERS times (default 20) under a stream of claims and leases; check nothing is lost or goes back, and report kill → first grant.
	CI=true $(GO) test -count=1 -v -timeout 60m ./test/failover/ -run '^TestFailoverLosesNoClaim$$' -failover.count=$(FAILOVERS)

##@ Demo

.PHONY: demo
demo: demo-notice deps node-deps tools ## Two data centres on real kubelets, one CronJob every minute: who ran each window, who skipped and why (as root; DEMO_FLAGS="-minutes 5 -dcs 3 -mode schedule,lease").
	$(GO) build -o $(BIN)/dislock-demo ./test/demo
	$(BIN)/dislock-demo $(DEMO_FLAGS)

.PHONY: demo-notice
demo-notice:
	@test -x $(BIN)/kubelet || echo "demo: first run on this machine: installing Debian packages and building the Kubernetes tools into bin/ (~25 min, once)"

##@ Build

.PHONY: tools
tools: ## Build the Kubernetes binaries, etcd, kubectl and helm from the Go module proxy into bin/ (once; ~25 min cold).
	test/tools/build.sh $(TOOLS)

.PHONY: build
build: ## Build bin/dislock.
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/dislock .

##@ Deploy

IMG            ?= ghcr.io/dislock/dislock:$(VERSION)
# The sidecar's agent-only image (the webhook's --agent-image, the chart's agent.image).
AGENT_IMG      ?= ghcr.io/dislock/dislock-agent:$(VERSION)
CONTAINER_TOOL ?= docker
HELM           ?= $(BIN)/helm
KUBECTL        ?= $(BIN)/kubectl
NAMESPACE      ?= dislock-system

$(BIN)/helm $(BIN)/kubectl $(BIN)/etcd:
	test/tools/build.sh $(notdir $@) >&2

.PHONY: manifests
manifests: $(HELM) ## Render the chart for one data centre to stdout: make -s manifests CLUSTER_NAME=dc-a [VALUES=dc-a.yaml] > dislock.yaml
	@$(HELM) template dislock charts/dislock --namespace $(NAMESPACE) \
		$(if $(VALUES),--values $(VALUES),--set database.existingSecret=dislock-db) \
		$(if $(CLUSTER_NAME),--set-string clusterName=$(CLUSTER_NAME))

.PHONY: helm-lint
helm-lint: $(HELM) ## Lint the chart (strict) with its own certificates and with cert-manager.
	$(HELM) lint --strict charts/dislock --set clusterName=lint --set database.existingSecret=dislock-db
	$(HELM) lint --strict charts/dislock --set clusterName=lint --set database.existingSecret=dislock-db \
		--set certManager.enabled=true --set serviceMonitor.enabled=true --set networkPolicy.enabled=true

# make image: the images' platform (amd64 or arm64; one per tarball).
IMAGE_ARCH     ?= $(shell $(GO) env GOARCH)

.PHONY: image
image: ## Build IMG and AGENT_IMG without a container daemon (internal/image, the recipe the Dockerfile and the e2e tests use) into bin/images/{dislock,dislock-agent}.tar: docker-archive tarballs for ctr images import, docker load, crane push (IMAGE_ARCH=amd64|arm64).
	$(GO) run ./internal/image/cmd/dislock-image build -o $(BIN)/images -version=$(VERSION) -commit=$(COMMIT) \
		-arch=$(IMAGE_ARCH) -webhook-tag=$(IMG) -agent-tag=$(AGENT_IMG)

.PHONY: docker-build
docker-build: ## Build the webhook image IMG and the sidecar's agent-only image AGENT_IMG with the Dockerfile, which runs the same recipe (CONTAINER_TOOL=docker|podman).
	$(CONTAINER_TOOL) build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) --target webhook -t $(IMG) .
	$(CONTAINER_TOOL) build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) --target agent -t $(AGENT_IMG) .

.PHONY: docker-push
docker-push: ## Push IMG and AGENT_IMG.
	$(CONTAINER_TOOL) push $(IMG)
	$(CONTAINER_TOOL) push $(AGENT_IMG)

##@ Release

# make release: the key that signs (empty: a key pair generated for the run, a dry run).
RELEASE_KEY ?=

.PHONY: release-tools
release-tools: ## Build cosign, cyclonedx-gomod and crane, pinned in hack/release/tools, into bin/ (once; ~7 min cold).
	hack/release/tools/build.sh

.PHONY: release
release: release-tools $(HELM) ## Build, sign and verify every artefact of release VERSION=x.y.z into dist/, offline (docs/release.md; RELEASE_KEY=cosign.key to sign a real one).
	$(GO) run ./hack/release -version=$(VERSION) -commit=$(COMMIT) -o dist -helm=$(HELM) \
		-cosign=$(BIN)/cosign -cyclonedx-gomod=$(BIN)/cyclonedx-gomod $(if $(RELEASE_KEY),-key=$(RELEASE_KEY))
