# gputopo: two commands on a fresh machine —
#   make run    installs into .venv and runs the simulator on the embedded default cluster
#   make test   installs into .venv and runs lint, the import contracts, mypy and the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run demo test test-real real-build lint imports types proto bench images diagram clean

# pip's own progress (each package as it is collected, downloaded and installed) is shown: a
# fresh install takes about a minute and should not look hung.
$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> upgrading pip"
	$(BIN)/python -m pip install --quiet --upgrade pip
	@echo "==> installing gputopo and its dev tools into $(VENV) (about a minute on a fresh machine)"
	$(BIN)/python -m pip install --progress-bar on -e ".[dev]"
	touch $(STAMP)
	@echo "==> installed: . $(VENV)/bin/activate, then gputopo --help (or: make run, make test)"

install: $(STAMP)

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

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -m "not real"

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
