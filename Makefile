# Two entry points for a fresh clone: `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# A second venv with the lowest supported Airflow, pyarrow, duckdb and boto3 (constraints-lowest.txt) and
# the package without dev extras: `make compat` smoke-tests what a user installing into an older Airflow
# gets. Built once; the package itself is reinstalled on every run.
COMPAT_VENV := .venv-compat
COMPAT_STAMP := $(COMPAT_VENV)/.installed
PYSPARK_VERSION := 4.2.0
export PYTHONHASHSEED := 0

.PHONY: venv system-deps demo test test-scale lint typecheck unit compat bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(MAKE) --no-print-directory system-deps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip uv
	# pyproject.toml holds version ranges; constraints.txt the exact versions this environment is tested with.
	$(BIN)/uv pip install --python $(BIN)/python --quiet --compile-bytecode -c constraints.txt -e '.[dev]'
	# pyspark-client (from the Spark provider) shares the pyspark/ folder: reinstall pyspark last so
	# its files win; the pins in pyproject.toml keep both at the same version.
	$(BIN)/uv pip install --python $(BIN)/python --quiet --compile-bytecode --reinstall --no-deps pyspark==$(PYSPARK_VERSION)
	touch $(STAMP)

$(COMPAT_STAMP): pyproject.toml constraints-lowest.txt | $(STAMP)
	rm -rf $(COMPAT_VENV)
	$(BIN)/uv venv --quiet --python $(PYTHON) $(COMPAT_VENV)
	$(BIN)/uv pip install --python $(COMPAT_VENV)/bin/python --quiet -c constraints-lowest.txt .
	$(BIN)/uv pip install --python $(COMPAT_VENV)/bin/python --quiet --reinstall --no-deps pyspark==$(PYSPARK_VERSION)
	touch $(COMPAT_STAMP)

# The Postgres JDBC driver for Spark comes from Debian (Maven Central is not assumed reachable).
JDBC_JAR := /usr/share/java/postgresql.jar
# The Partitions page's browser test drives Debian's chromium through its chromedriver.
CHROMEDRIVER := /usr/bin/chromedriver
system-deps:
	@if [ ! -f $(JDBC_JAR) ]; then \
		if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
			(apt-get install -y -qq libpostgresql-jdbc-java >/dev/null 2>&1 || \
			 (apt-get update -qq >/dev/null && apt-get install -y -qq libpostgresql-jdbc-java >/dev/null)); \
		else \
			echo "note: $(JDBC_JAR) missing; install libpostgresql-jdbc-java for Spark JDBC reads"; \
		fi; \
	fi
	@if [ ! -x $(CHROMEDRIVER) ]; then \
		if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
			(apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 || \
			 (apt-get update -qq >/dev/null && apt-get install -y -qq chromium chromium-driver >/dev/null)); \
		else \
			echo "note: $(CHROMEDRIVER) missing; install chromium chromium-driver for the browser test"; \
		fi; \
	fi

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

# Two workers (pytest-xdist): each test module runs whole on one of them, the modules of the shared
# Airflow stack on the same one (tests/conftest.py); UNIT_WORKERS=0 runs everything in this process.
UNIT_WORKERS ?= 2
unit: venv
	$(BIN)/python -m pytest -q -n $(UNIT_WORKERS)

# Minutes each: 3,000 partitions through dag.test(), 1,500 through the real scheduler, the DAG on a
# standalone Spark cluster (master + two workers) with a worker lost mid-stage.
test-scale: venv
	$(BIN)/python -m pytest -q --scale -m scale

# The smoke test runs from a scratch directory, so it imports the installed package, not the checkout.
compat: $(COMPAT_STAMP)
	$(BIN)/uv pip install --python $(COMPAT_VENV)/bin/python --quiet --reinstall-package airflow-partitions --no-deps .
	scratch=$$(mktemp -d) && cd $$scratch && $(CURDIR)/$(COMPAT_VENV)/bin/python $(CURDIR)/tests/install_smoke.py $$scratch; \
		status=$$?; rm -rf $$scratch; exit $$status

test: lint typecheck unit compat

demo: venv
	$(BIN)/python -m airflow_partitions.demo

bench: venv
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf $(VENV) $(COMPAT_VENV) .accelerations .demo .pytest_jvm build *.egg-info
