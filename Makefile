# One command set for people and CI: `make demo`, `make test`, `make lint`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: demo test lint format services clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/orchestrator demo

services:
	@scripts/ensure-services.sh

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(BIN)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Three test processes (pytest-xdist), each file on one of them, on two cores: the tests wait on
# real processes and servers much of the time. Measured with every process's CPU sampled: two
# left more than a third of the two cores idle (22 min 24 s), three 18 min 39 s, a quarter idle.
# TEST_WORKERS=0 runs it in this process alone. The run ends with its 30 slowest tests: the
# whole run must stay well under 20 minutes on two cores, and they show where it goes.
TEST_WORKERS ?= 3

# The suite starts hundreds of `orchestrator` processes. Where PYTHONDONTWRITEBYTECODE is set (as
# in CI's image and the Dockerfile) each would compile the package's source again: about 0.3 s
# of CPU per process. compileall writes the bytecode once, whatever that variable says.
test: $(BIN)/.installed services lint
	$(BIN)/python -m compileall -q orchestrator workers
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --durations=30

clean:
	rm -rf .orchestrator .pytest_cache .mypy_cache .ruff_cache
