# One venv for everything; `make up` and `make test` set it up on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test check lint types contract proto bench onefile clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

up: $(STAMP)  ## run hub + worker on loopback
	$(BIN)/agentworker up

# pytest exits 5 when it collected nothing: a suite that ran no test has not passed.
# Two processes (pytest-xdist), each running whole files in order: most tests wait on
# subprocesses, so the suite takes about half the time on two cores.
test: $(STAMP)  ## the whole suite
	$(BIN)/pytest -q -n 2 --dist loadfile; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose" >&2; exit 1; fi; \
	exit $$rc

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

types: $(STAMP)
	$(BIN)/mypy

contract: $(STAMP)
	$(BIN)/lint-imports

check: lint types contract test  ## everything CI holds a change to

proto: $(STAMP)  ## regenerate worker/wire/proto from agentworker.proto
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. \
		worker/wire/proto/agentworker.proto

# Each benchmark records its goals (benchmarks/_common.py: goal) in this file; the
# last step prints them all in one table. RUNS=3 runs them all three times over and
# the table gives each goal's medians and spread (what a closing note reports).
RUNS ?= 1
BENCHES := roundtrip grown_db exec fs computer hub_scale sandbox replay tui cli
bench: export AGENTWORKER_BENCH_GOALS := $(abspath $(VENV)/bench-goals.jsonl)
bench: $(STAMP)  ## benchmarks beside raw baselines, then one table of the goals (RUNS=3: medians)
	rm -f "$$AGENTWORKER_BENCH_GOALS"
	for run in $$(seq $(RUNS)); do \
		for name in $(BENCHES); do $(BIN)/python benchmarks/bench_$$name.py || exit 1; done; \
	done
	$(BIN)/python benchmarks/summary.py "$$AGENTWORKER_BENCH_GOALS"

onefile: $(STAMP)  ## dist/agentworker: the one-file build, smoke-tested
	packaging/onefile/build.sh $(BIN)/python

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist
