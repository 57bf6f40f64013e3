# Setup is automatic: every target creates .venv and installs statekit with its extras when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-local test test-heavy test-slow test-cluster lint bench docs clean

$(STAMP): pyproject.toml
	@PYTHON=$(PYTHON) VENV=$(VENV) tools/setup-venv
	@touch $(STAMP)

demo: $(STAMP)  ## the main job: a Structured Streaming query on local Spark with RocksDB state
	$(PY) -m statekit.demo.spark_demo

demo-local: $(STAMP)  ## the same kind of job on the local runner (no Spark)
	$(PY) -m statekit.demo.local_demo

test: $(STAMP)  ## the default test run (one case per adapter, backend, storage; the rest of each matrix is marked heavy, the longest runs slow)
	$(PY) -m pytest -m "not slow and not cluster and not heavy" -q -p no:cacheprovider --timeout=900 -n auto --maxprocesses=4

test-heavy: $(STAMP)  ## the tests marked heavy (CI runs them): every backend x storage, more seeds and examples
	$(PY) -m pytest -m "heavy and not slow and not cluster" -q -p no:cacheprovider --timeout=900 -n auto --maxprocesses=4

test-slow: $(STAMP)
	$(PY) -m pytest -m slow -q -p no:cacheprovider --timeout=3600

test-cluster: $(STAMP)  ## Spark standalone cluster tests (Workers in network namespaces as root; ~6-15 min)
	$(PY) -m pytest -m cluster -q -p no:cacheprovider --timeout=900 --durations=0 -rA

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/lint-imports --no-cache

BENCH_PYTEST := $(PY) -m pytest benchmarks --ignore=benchmarks/diskprofiles -p no:cacheprovider -q -s \
	-o testpaths=benchmarks --benchmark-sort=name --benchmark-columns=min,median,max,rounds
BENCH_QUICK_ARGS ?= -m "not spark and not large"

bench: $(STAMP)  ## full run (~15 min with the Spark end-to-end part; the timers' 10^7 cases, the Spark session benchmark and the Spark compat benchmark add one to two hours): benchmarks/results/full.json -> docs/benchmarks.md, docs/img/
	mkdir -p benchmarks/results
	$(BENCH_PYTEST) --benchmark-json=benchmarks/results/full.json $(BENCH_ARGS); status=$$?; \
	BENCH_ARGS='$(BENCH_ARGS)' $(PY) -m benchmarks.report benchmarks/results/full.json --command "make bench" \
		--out docs/benchmarks.md --img-dir docs/img; exit $$status

.PHONY: bench-quick
bench-quick: $(STAMP)  ## < 3 min, no timing assertions (CI): benchmarks/results/quick.{json,md}
	mkdir -p benchmarks/results
	STATEKIT_BENCH_QUICK=1 $(BENCH_PYTEST) --benchmark-json=benchmarks/results/quick.json \
		$(BENCH_QUICK_ARGS) $(BENCH_ARGS); status=$$?; \
	$(PY) -m benchmarks.report benchmarks/results/quick.json --command "make bench-quick" \
		--spark benchmarks/results/spark-quick.json \
		--spark-sessions benchmarks/results/spark-sessions-quick.json \
		--spark-compat benchmarks/results/spark-compat-quick.json --out benchmarks/results/quick.md \
		--img-dir benchmarks/results/img-quick; exit $$status

docs: $(STAMP)  ## the documentation site in site/ (MkDocs, strict: a broken link fails)
	$(VENV)/bin/python -m mkdocs --version >/dev/null 2>&1 || $(VENV)/bin/python -m pip install -q "mkdocs>=1.6,<2"
	$(VENV)/bin/python -m mkdocs build --strict

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks site
