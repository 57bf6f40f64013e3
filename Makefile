# Setup is automatic: every target creates .venv and installs statekit with its extras when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-local test test-slow lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,bench]"
	touch $(STAMP)

demo: $(STAMP)  ## the main job: a Structured Streaming query on local Spark with RocksDB state
	$(PY) -m statekit.demo.spark_demo

demo-local: $(STAMP)  ## the same kind of job on the local runner (no Spark)
	$(PY) -m statekit.demo.local_demo

test: $(STAMP)  ## the default test run (heavier tests are marked slow)
	$(PY) -m pytest -m "not slow" -q -p no:cacheprovider --timeout=900

test-slow: $(STAMP)
	$(PY) -m pytest -m slow -q -p no:cacheprovider --timeout=3600

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks
