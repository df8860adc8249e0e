# django-redlock: the two commands a newcomer needs are `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test test-fast test-matrix test-servers torture simulate bench bench-contention bench-scaling soak-memory docs clean

demo:  ## run the example project on 5 local Redis masters
	@VENV=$(VENV) sh scripts/setup.sh demo
	@$(PY) example_project/run_demo.py

test:  ## the whole test suite, against real redis-server processes
	@VENV=$(VENV) WANT_BROWSER=1 WANT_POSTGRES=1 sh scripts/setup.sh test,docs
	@$(PY) -m pytest $(PYTEST_ARGS)

test-fast:  ## the suite without the browser and torture tests
	@VENV=$(VENV) sh scripts/setup.sh test
	@$(PY) -m pytest -m "not browser and not torture" $(PYTEST_ARGS)

test-matrix:  ## the suite on Python 3.13 + Django 6.1 + newest redis-py and 3.12 + Django 6.0 + oldest, when installed
	@VENV=$(VENV) sh scripts/setup.sh test
	@sh scripts/matrix.sh

SERVERS ?=
test-servers:  ## the engine and safety tests on Redis 6.2, Redis 7.x and Valkey 8.x (SERVERS="valkey 8": one of them)
	@VENV=$(VENV) sh scripts/setup.sh test,servers
	@$(PY) scripts/test_servers.py $(if $(SERVERS),"$(SERVERS)")

torture:  ## the long fault-injection run
	@VENV=$(VENV) sh scripts/setup.sh test
	@REDLOCK_TORTURE_SECONDS=$${REDLOCK_TORTURE_SECONDS:-120} $(PY) -m pytest -m torture -s $(PYTEST_ARGS)

SEEDS ?= 1000
simulate:  ## the long deterministic simulation of the engine (its core and its real managers): SEEDS random runs, SEEDS/10 more with an AsyncLockManager process, every small schedule, the mutants
	@VENV=$(VENV) sh scripts/setup.sh test
	@$(PY) -m tests.simulation.run --seeds $(SEEDS)
	@$(PY) -m tests.simulation.run --seeds $$(( $(SEEDS) / 10 + 1 )) --first $(SEEDS) --async-managers 1
	@$(PY) -m tests.simulation.exhaustive --max-depth 11
	@$(PY) -m tests.simulation.mutants

bench:  ## benchmarks against pottery, redlock-py, redis-py's Lock and python-redis-lock, admin_render.py; ends with the targets and their verdicts
	@VENV=$(VENV) sh scripts/setup.sh bench
	@$(PY) benchmarks/bench.py --iterations 3000 --budget 60 --json docs/benchmarks.json \
		--plot docs/img/benchmark.png --rst docs/benchmarks_table.rst

bench-contention:  ## only the contention scenario (8 processes, one key), merged into the docs' results; ends with its targets
	@VENV=$(VENV) sh scripts/setup.sh bench
	@$(PY) benchmarks/bench.py --only contention --workers 8 --seconds 10 --json docs/benchmarks.json \
		--plot docs/img/benchmark.png --rst docs/benchmarks_table.rst

bench-scaling:  ## latency and memory against the number of masters (1 to 9), and with a 1 ms round trip added; ends with the targets
	@VENV=$(VENV) sh scripts/setup.sh bench
	@$(PY) benchmarks/scaling.py --iterations 2000 --rtt-ms 1 --json docs/scaling.json \
		--plot docs/img/scaling.png --rst docs/scaling_table.rst

SOAK_MINUTES ?= 10
soak-memory:  ## worker memory (RSS, tracemalloc) over a long load run under gunicorn and uvicorn, niced
	@VENV=$(VENV) sh scripts/setup.sh soak
	@nice -n 10 $(PY) benchmarks/memory_soak.py --minutes $(SOAK_MINUTES)

docs:  ## build the docs with warnings as errors
	@VENV=$(VENV) sh scripts/setup.sh docs
	@$(VENV)/bin/sphinx-build -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf docs/_build .pytest_cache example_project/.redis
