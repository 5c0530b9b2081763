# cronscale: `make dev` runs the whole system locally; `make test` runs the whole suite.
# Both work on a machine that has never seen the project (Python 3.11+, Java 17, Maven).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CRONSCALE := $(BIN)/cronscale
STAMP := $(VENV)/.installed-stamp

.PHONY: dev test lint typecheck protos protos-check services migrate install bench chaos clean down

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required (found %s)" % sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

## services: fetch (first time) and start the real local Cassandra and Kafka
services: install
	$(CRONSCALE) local up

## migrate: create the keyspace and apply schema migrations
migrate: services
	$(CRONSCALE) db migrate

## dev: everything up, then api + dispatcher + worker with a demo schedule in this terminal
dev: migrate
	$(CRONSCALE) dev

## test: lint, type checks, generated-code check, then unit, integration and e2e tests
test: lint typecheck protos-check migrate
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

## protos: regenerate the committed stubs in proto/cronscale/v1
protos: install
	PYTHON=$(abspath $(BIN)/python) PATH=$(abspath $(BIN)):$$PATH proto/generate.sh

## protos-check: fail if the committed stubs differ from a fresh generation
protos-check: protos
	@git diff --exit-code --stat -- proto/ || (echo "generated stubs are stale: run 'make protos' and commit" && exit 1)

## bench: the firing-load harness (see loadtest/README.md)
bench: migrate
	$(BIN)/python -m loadtest.firing

## chaos: the fault-injection proof on a private Cassandra + Kafka (docs/operations/chaos.md)
chaos: install
	$(BIN)/python -m tests.chaos.harness --duration $(or $(DURATION),10m)

down:
	$(CRONSCALE) local down

clean: down
	rm -rf $(VENV) .local
