# Two entry points for a fresh clone: `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYTHONHASHSEED := 0

.PHONY: venv system-deps demo test lint typecheck unit bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(MAKE) --no-print-directory system-deps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip uv
	$(BIN)/uv pip install --python $(BIN)/python --quiet --compile-bytecode -e '.[dev]'
	# pyspark-client (from the Spark provider) shares the pyspark/ folder: reinstall pyspark last so
	# its files win; the pins in pyproject.toml keep both at the same version.
	$(BIN)/uv pip install --python $(BIN)/python --quiet --compile-bytecode --reinstall --no-deps pyspark==4.2.0
	touch $(STAMP)

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

unit: venv
	$(BIN)/python -m pytest -q

test: lint typecheck unit

demo: venv
	$(BIN)/python -m airflow_partitions.demo

bench: venv
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf $(VENV) .accelerations .demo build *.egg-info
