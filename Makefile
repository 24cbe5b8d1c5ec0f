# pipectl: the two commands of the README are `make demo` and `make test`.
SHELL := /bin/bash
VENV := .venv

.PHONY: setup demo test test-unit bench render golden schemas ceph-up ceph-down cluster-build cluster-up cluster-down images images-push node-up node-down test-node test-node-only clean

setup:
	bash scripts/setup.sh

# Set up, then train and register a model end to end on this machine (embedded S3 + MLflow).
demo: setup
	$(VENV)/bin/pipectl run training

# Set up, then run every test: unit, golden, integration with real local services, a real Ceph, a
# real Alluxio, the loopback Kubernetes + Argo + Volcano cluster (KWOK nodes); then the real-pod tests
# (step images, a real node: containerd + kubelet, the training pipeline in real containers) as a
# second pytest run, once the KWOK cluster is down. scripts/test.sh prepares what is independent in
# parallel (venv, Go builds of the test cluster, step images), times each phase and prints the table
# at the end; both pytest runs always run and the exit status is non-zero if any phase failed.
test:
	bash scripts/test.sh

# The real-pod tests alone, with what they need installed and built.
test-node: setup
	bash scripts/system-deps.sh ceph node
	bash tests/cluster/build.sh
	$(MAKE) --no-print-directory test-node-only

test-node-only:
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

# Set up, then run the benchmarks side by side with their peers (tests/bench/); tables
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
# Debian's Docker engine (started when not running), and the examples' images FROM step-train
# (pipectl/example-<name>); each skipped when its content is unchanged.
images:
	bash scripts/images.sh

# Your cluster's step images: built with plain `docker build` on a public Python base (by digest),
# pushed to your registry; prints the site file's `registry` and `images` (the pushed digests).
#   make images-push REGISTRY=registry.example.com/ml
images-push:
	@test -n "$(REGISTRY)" || { echo "usage: make images-push REGISTRY=registry.example.com/ml" >&2; exit 2; }
	bash scripts/push-images.sh $(REGISTRY)

# A real node (containerd, runc, CNI, kubelet; pause/argoexec/step images loaded) on top of
# `make cluster-up`; needs root. Pods run for real: `pipectl submit training --wait` works on it.
node-up: setup
	@bash scripts/node-up.sh /tmp/pipectl-cluster
node-down:
	@bash scripts/node-down.sh /tmp/pipectl-cluster

clean:
	rm -rf .pipectl .pytest_cache

# The GPU check: the pipeline's step entrypoints on a GPU (stage → preprocess --device gpu →
# train (nccl) → evaluate → register; 2-process DDP with 2 GPUs) and preprocess vs DALI's own ceiling,
# one table. Without a GPU the GPU rows say so and the rest runs on the CPU. On the lent GPU machine
# (no registry, 64 MiB per call): the pack/receive/run sequence in scripts/gpu_check.sh. No `setup`
# prerequisite: the GPU machine reaches no registry.
.PHONY: gpu-check
gpu-check:
	bash scripts/gpu_check.sh run $(GPU_CHECK_ARGS)
