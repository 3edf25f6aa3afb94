# Gemini: one-command entry points. Each target installs what it needs into .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench proto clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)  ## Booster on embedded PostgreSQL, driven by a simulated demo fleet over gRPC
	$(BIN)/booster demo

test: $(STAMP)  ## lint, then every test (real PostgreSQL, embedded)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

bench: $(STAMP)  ## the benchmarks; results are written to benchmarks/results/
	$(BIN)/python -m benchmarks.ingest
	$(BIN)/python -m benchmarks.get_parameters
	$(BIN)/python -m benchmarks.refit

proto: $(STAMP)  ## regenerate protobuf/gRPC stubs after editing api/gemini_api/v1/*.proto
	$(BIN)/python scripts/gen_proto.py

clean:
	rm -rf $(VENV) var .pytest_cache
