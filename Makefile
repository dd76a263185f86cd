# gputopo: two commands on a fresh machine —
#   make run    installs into .venv and runs the simulator on the embedded default cluster
#   make test   installs into .venv and runs lint, the import contracts, mypy and the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Exact versions of everything `make install` puts in $(VENV) (pip, the runtime dependencies and
# the [dev] tools): the set the suite was last green with. pyproject.toml keeps lower bounds
# only, for whoever installs gputopo into their own environment. `make lock` rewrites it.
LOCK   := requirements.lock

.PHONY: install lock run demo test test-real real-build lint imports types proto bench images diagram dra-layouts clean

# pip's own progress (each package as it is collected, downloaded and installed) is shown: a
# fresh install takes a few minutes on the 2-core machine and should not look hung.
$(STAMP): pyproject.toml $(LOCK)
	@echo "==> creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> installing pip as $(LOCK) pins it"
	$(BIN)/python -m pip install --quiet -c $(LOCK) --upgrade pip
	@echo "==> installing gputopo and its dev tools into $(VENV) at the versions in $(LOCK)"
	$(BIN)/python -m pip install --progress-bar on -c $(LOCK) -e ".[dev]"
	touch $(STAMP)
	@echo "==> installed: . $(VENV)/bin/activate, then gputopo --help (or: make run, make test)"

install: $(STAMP)

# The committed proto/ code names the generator that made it; `make lock` keeps the generator
# (grpcio-tools, with grpcio beside it) and the protobuf runtime at those versions, so that a
# refreshed lock never makes tests/test_proto_drift.py fail on a clean checkout. To move gRPC on
# purpose: make lock GRPC_PIN=X PROTOBUF_PIN=Y, then make install, make proto, and commit all.
GEN_GRPC     := proto/gputopo_proto/status/v1/status_pb2_grpc.py
GEN_PB2      := proto/gputopo_proto/status/v1/status_pb2.py
GRPC_PIN     ?= $(shell sed -n "s/^GRPC_GENERATED_VERSION = '\(.*\)'/\1/p" $(GEN_GRPC))
PROTOBUF_PIN ?= $(shell sed -n 's/^\# Protobuf Python Version: //p' $(GEN_PB2))

# Refreshes $(LOCK) on purpose (nothing runs it for you): a fresh temporary venv, the newest
# versions that satisfy pyproject.toml (the generator pins above aside), frozen. Then
# `make test` (the stamp depends on the lock, so it reinstalls) and commit the lock if green.
lock:
	@test -n "$(GRPC_PIN)" -a -n "$(PROTOBUF_PIN)" || { echo "cannot read the generator versions from proto/"; exit 1; }
	set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install --quiet --upgrade pip; \
	"$$tmp/venv/bin/python" -m pip install --progress-bar on -e ".[dev]" \
	  "grpcio==$(GRPC_PIN)" "grpcio-tools==$(GRPC_PIN)" "protobuf==$(PROTOBUF_PIN)"; \
	"$$tmp/venv/bin/python" -m pip check; \
	{ echo "# Exact versions for make install (pip install -c $(LOCK) -e \".[dev]\")."; \
	  echo "# Made by make lock: a fresh venv ($$("$$tmp/venv/bin/python" --version)), pip install -e \".[dev]\""; \
	  echo "# unconstrained but for grpcio, grpcio-tools ($(GRPC_PIN)) and protobuf ($(PROTOBUF_PIN)), which"; \
	  echo "# follow the committed proto/ code; then pip freeze --all --exclude-editable. Do not edit"; \
	  echo "# by hand: rerun make lock, then make test, and commit it if green."; \
	  "$$tmp/venv/bin/python" -m pip freeze --all --exclude-editable; } > $(LOCK).tmp; \
	mv $(LOCK).tmp $(LOCK)
	@echo "==> wrote $(LOCK); now make test (it reinstalls from the new lock)"

run: $(STAMP)
	$(BIN)/gputopo simulate

demo: $(STAMP)
	$(BIN)/gputopo topo --topology dgx1-v100
	$(BIN)/gputopo prefer --topology dgx1-v100 --size 2 --available 0,1,2,4,5

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check gputopo deviceplugin scheduler gputopo_kube kubectl_gputopo tests bench tools

# Layers (pyproject.toml [tool.importlinter]): core below the daemons, daemons independent,
# no gRPC / NVML / Kubernetes / HTTP-server library in the core.
imports: $(STAMP)
	$(BIN)/lint-imports

# Types (pyproject.toml [tool.mypy], which names the files): strict for gputopo/, checked for
# the daemons. `mypy` runs with no arguments so the config alone decides what is checked.
types: $(STAMP)
	$(BIN)/mypy

# The suite runs on TEST_WORKERS pytest-xdist workers: one more than the CPUs, since part of
# the suite waits on its servers, sockets and watches (on the 2-core machine 437 s on three
# workers against 489 s on two, docs/testing.md). Every test keeps to its own temporary folders,
# sockets and ephemeral ports, so they run side by side. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print((os.cpu_count() or 1) + 1)")

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -m "not real" -n $(TEST_WORKERS)

# The suites against real Kubernetes components (kube-apiserver with etcd, kube-scheduler,
# kubelet's device manager), built from the Go modules realk8s/go.mod requires into the ignored
# folder realk8s/.build/ (cached by the go command; docs/testing.md has cold and warm times).
test-real: $(STAMP)
	sh realk8s/test-real.sh $(BIN)/python

real-build:
	sh realk8s/build.sh

proto: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH sh proto/generate.sh

# The README's architecture picture, from the import-linter layers and the imports in the code
# (tests/test_architecture.py fails when the committed picture differs).
diagram: $(STAMP)
	$(BIN)/python tools/architecture.py --write

# The DRA DeviceClasses of deploy/ and the chart's layout rows, from the one table of device
# layouts, gputopo.node.draslices.LAYOUTS (tests/test_dra_manifests.py fails when they differ).
dra-layouts: $(STAMP)
	$(BIN)/python tools/dra_layouts.py --write

bench: $(STAMP)
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

# The two images under the names deploy/ and charts/gputopo use; set REGISTRY to yours, then
# push both and point the install at it (docs/operator.md). VERSION is the project version.
REGISTRY ?= ghcr.io/gputopo
VERSION  ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
images:
	docker build -f Dockerfile.plugin    --build-arg VERSION=$(VERSION) -t $(REGISTRY)/gputopo-device-plugin:$(VERSION) .
	docker build -f Dockerfile.scheduler --build-arg VERSION=$(VERSION) -t $(REGISTRY)/gputopo-scheduler-extender:$(VERSION) .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache .import_linter_cache .hypothesis
