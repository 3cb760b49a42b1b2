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

## test: lint, then the whole test suite, then the official client's, security's and AckAndReceive's modules again through
## two gRPC front-end processes (--workers 2; the suite's brokers serve gRPC in one process)
FRONT_END_TESTS = tests/broker/test_official_client.py tests/security/test_auth_official_client.py \
	tests/security/test_tls_and_protected_mode.py tests/security/test_telemetry_auth.py \
	tests/client/test_ack_and_receive.py
test: lint
	$(BIN)/pytest -n 2 -q
	SIFTMQ_TEST_WORKERS=2 $(BIN)/pytest -n 2 -q -p no:randomly $(FRONT_END_TESTS)

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
	$(BIN)/python benchmarks/bench_workers.py
	$(BIN)/python benchmarks/bench_peer_nats.py  # says what it needs when nats-server or nats-py is missing

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
