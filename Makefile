# The two commands a newcomer needs (see README):
#   make dev    set up what serving needs, then serve the product on the local backend
#               at http://127.0.0.1:8000
#   make test   set up what the tests need, then lint and run every test tier
#   make cluster       build the image, start a local node (control plane + kubelet), install
#                      the chart and print how to reach it; make cluster-down stops it
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# What serving needs only (make dev): the package and the libraries sandboxed code gets,
# not the test toolchain (playwright, schemathesis, SeaweedFS, kind…) that $(STAMP) adds.
SERVE_STAMP := $(VENV)/.installed-serve
HOST   ?= 127.0.0.1
PORT   ?= 8000
DATA   ?= ./data
# Workers of the test command (pytest-xdist): two, one per core of the machines it is
# budgeted for; a file (or the node tier) stays on one worker (tests/support/prebuild.py).
TEST_WORKERS ?= 2

.PHONY: dev test fuzz setup lint format bench clean cluster cluster-down

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(SERVE_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[sandbox]'
	@touch $(SERVE_STAMP)

# The test toolchain includes what serving needs: both stamps are then current.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP) $(SERVE_STAMP)

setup: $(STAMP)

dev: $(SERVE_STAMP)
	$(BIN)/sandbox-workspace dev --host $(HOST) --port $(PORT) --data-dir $(DATA)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: lint
	bash scripts/install-system-deps.sh
	bash scripts/install-node-deps.sh
	bash scripts/install-e2b-old-sdk.sh
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# The contract fuzzer with new seeds and more examples (the test command's seed is fixed,
# so it never fails at random): run before each landing; a failure prints its seed.
fuzz: $(STAMP)
	SANDBOX_FUZZ_SEED=random SANDBOX_FUZZ_EXAMPLES=$(or $(EXAMPLES),40) \
	  $(BIN)/pytest -s tests/api/test_contract_schemathesis.py

# The Helm path on a real node, as the node tier installs it (docs/operations.md
# "Try the chart on a local node"): needs root and the node tier's tools.
cluster: $(STAMP)
	$(BIN)/python scripts/cluster.py up $(if $(CLUSTER_PORT),--port $(CLUSTER_PORT))

cluster-down: $(STAMP)
	$(BIN)/python scripts/cluster.py down

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
