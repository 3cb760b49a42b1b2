# Set-up is automatic: every target below creates .venv and installs siftmq on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXPR ?= Region = 'Hangzhou' AND price > 30
PROPS ?= Region=Hangzhou price=45

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## run: the main job (until the broker lands: check and evaluate a filter; EXPR=..., PROPS=...)
run: $(STAMP)
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

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
