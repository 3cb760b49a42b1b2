# Set-up is automatic: every target below creates .venv and installs siftmq on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXPR ?= Region = 'Hangzhou' AND price > 30
PROPS ?= Region=Hangzhou price=45

.PHONY: run filter test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

## run: the main job: the broker on 127.0.0.1:8081 with its data under ./data (ARGS="--flush sync ...")
run: $(STAMP)
	$(BIN)/siftmq broker --data-dir ./data $(ARGS)

## filter: check and evaluate one filter expression (EXPR=..., PROPS=...)
filter: $(STAMP)
	$(BIN)/siftmq filter check "$(EXPR)"
	-$(BIN)/siftmq filter eval "$(EXPR)" $(PROPS)

## lint: ruff, mypy and the layer contracts
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

## test: lint, then the whole test suite
test: lint
	$(BIN)/pytest -n 2 -q

## bench: the benchmarks (figures for the README)
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_filter.py
	$(BIN)/python benchmarks/bench_store.py
	$(BIN)/python benchmarks/bench_broker.py
	$(BIN)/python benchmarks/bench_client.py
	$(BIN)/python benchmarks/bench_floor.py
	$(BIN)/python benchmarks/bench_auth.py
	$(BIN)/python benchmarks/bench_auth_e2e.py
	$(BIN)/python benchmarks/bench_filter_server.py
	$(BIN)/python benchmarks/bench_peer_nats.py  # says what it needs when nats-server or nats-py is missing

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
