# pipectl: the two commands of the README are `make demo` and `make test`.
SHELL := /bin/bash
VENV := .venv

.PHONY: setup demo test test-unit bench render golden schemas ceph-up ceph-down cluster-build cluster-up cluster-down images node-up node-down test-node clean

setup:
	bash scripts/setup.sh

# Set up, then train and register a model end to end on this machine (embedded S3 + MLflow).
demo: setup
	$(VENV)/bin/pipectl run training

# Set up, then run every test (unit, golden, integration with real local services, a real Ceph,
# a real Alluxio, the loopback Kubernetes + Argo + Volcano cluster) but the real-pod tests
# (`make test-node`). Cold: builds the test cluster's upstream binaries from the Go module proxy
# first (~20 min, cached).
test: setup
	bash scripts/system-deps.sh ceph alluxio
	bash tests/cluster/build.sh
	PIPECTL_REQUIRE_CEPH=1 PIPECTL_REQUIRE_CLUSTER=1 $(VENV)/bin/pytest

# The real-pod tests (issue 5): step images (cold ~12 min), a real node (containerd, kubelet),
# the training pipeline in real pods (first image load into containerd ~9 min). Needs root.
test-node: setup
	bash scripts/system-deps.sh ceph node
	bash tests/cluster/build.sh
	bash scripts/images.sh
	PIPECTL_REQUIRE_CEPH=1 PIPECTL_REQUIRE_CLUSTER=1 PIPECTL_NODE_TESTS=1 $(VENV)/bin/pytest tests/cluster/test_real_pods.py

test-unit: setup
	$(VENV)/bin/pytest tests/unit tests/golden

# A loopback Kubernetes control plane (etcd, apiserver, controller-manager, scheduler, KWOK, Argo,
# Volcano) for manual use: eval "$$(make -s cluster-up)".
cluster-up: cluster-build
	@bash scripts/cluster-up.sh /tmp/pipectl-cluster
cluster-down:
	@bash scripts/cluster-down.sh /tmp/pipectl-cluster

# Set up, then run the benchmarks side by side with their peers (tests/bench/; issue 7); tables
# and JSON under tests/bench/results/. A subset: make bench BENCH="cli preprocess".
bench: setup
	bash scripts/system-deps.sh ceph alluxio bench
	bash tests/cluster/build.sh
	$(VENV)/bin/python -m tests.bench.run $(BENCH)

render: setup
	$(VENV)/bin/pipectl render training

# Regenerate the checked-in rendered manifests under argo/ (never done silently by tests).
golden: setup
	rm -rf argo && $(VENV)/bin/pipectl render cluster --write argo

# Refresh the upstream schemas `pipectl lint` uses (needs Go and the module proxy).
schemas: setup
	$(VENV)/bin/python scripts/vendor_schemas.py

# A single-node Ceph on loopback for manual use: eval "$$(make -s ceph-up)".
ceph-up:
	@bash scripts/ceph-up.sh /tmp/pipectl-ceph
ceph-down:
	@bash scripts/ceph-down.sh /tmp/pipectl-ceph

# Build (and cache) the upstream binaries of the test cluster: etcd, Kubernetes, Argo, Volcano, KWOK.
cluster-build:
	bash tests/cluster/build.sh

# The step images (pipectl/step-light, pipectl/step-train) from a debootstrap Debian base with
# Debian's Docker engine (started when not running); skipped when the content is unchanged.
images:
	bash scripts/images.sh

# A real node (containerd, runc, CNI, kubelet; pause/argoexec/step images loaded) on top of
# `make cluster-up`; needs root. Pods run for real: `pipectl submit training --wait` works on it.
node-up: setup
	@bash scripts/node-up.sh /tmp/pipectl-cluster
node-down:
	@bash scripts/node-down.sh /tmp/pipectl-cluster

clean:
	rm -rf .pipectl .pytest_cache
