# ksi developer entry points.  Everything `make run` and `make test` need is installed by them, so a
# fresh machine with python3, pip, apt-get and npm is enough:
#
#   make venv    .venv with ksi installed editable, plus the dev, test and spark extras
#   make run     `ksi dev`: the proxy in front of an embedded broker (and kcat, which the README's first
#                commands use); no Java: the demo's archive runs the pipeline's local engine, not Spark;
#                state is kept in .ksi-dev/, `make run ARGS=--reset` starts afresh
#   make spark-deps   Java, the JDBC drivers and the jars the pipeline's Spark engine and ksi compact need
#   make test    make lint, then the whole test suite, after installing the client programs the integration
#                tests drive (.ci/run runs exactly this)
#   make bench   the cold-path benchmark: direct, pass-through, cold first read, cold warm, seek, 8 consumers,
#                the Java consumer (make bench N=200000, or BENCH_ARGS='--shapes archive --rounds 1 --seeks 0
#                --large 0 --no-java': --large 0 skips the 10M-record tables, --seeks 0 the seeks)
#   make bench-passthrough   the pass-through benchmark: latency, 8+8 clients' throughput and CPU, idle polling
#                (PASSTHROUGH_ARGS='--quick', '--profile', '--broker tansu', '--history none',
#                '--placement ksi-own-cpu')
#   make bench-hop   the floor of any proxy: 8+8 clients direct, through a native splice relay and through ksi,
#                on tansu (HOP_ARGS='--rounds 3 --records 30000', '--mode copy')
#   make bench-archive   ksi archive vs direct consumption and a plain writer at 500k and 2M records, no-op and
#                10% incremental runs, --follow lag at 50k records/s, peak RSS (BENCH_ARCHIVE_ARGS='--sizes 200000')
#   make bench-scaleout   1 vs 3 ksi instances behind HAProxy: many consumers replaying history from the lake
#                (SCALEOUT_ARGS='--records 200000 --consumers 4 --rounds 1')
#   make soak    producers and cold and hot consumers through ksi for SOAK_SECONDS (300), the broker killed
#                half way; ends with produced vs consumed per partition (SOAK_ARGS='--partitions 4')
#   make fuzz    the fuzzer (tests/ksi/test_fuzz_*.py's properties against an in-process proxy) for FUZZ_SECONDS (600)
#   make lint    ruff check over every Python directory and mypy --strict over ksi/ and protocol/ (settings in
#                pyproject.toml); any finding fails it
#   make clean   caches and build output (make distclean also removes .venv, node_modules and .cache: the
#                Java/Go builds and jars)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# `make bench N=200000` is shorthand for BENCH_ARGS='--records 200000'.
BENCH_ARGS ?= $(if $(N),--records $(N))
SOAK_SECONDS ?= 300
SOAK_ARGS ?=
FUZZ_SECONDS ?= 600
PASSTHROUGH_ARGS ?=
SCALEOUT_ARGS ?=

BENCH_ARCHIVE_ARGS ?=

.PHONY: venv run kcat test test-deps spark-deps bench bench-passthrough bench-hop bench-archive bench-scaleout soak fuzz lint clean distclean

venv: $(STAMP)

# The interpreter: created once.  Debian's system python3 ships venv separately (python3-venv), so if
# `-m venv` fails there, install that and try again.
$(PY):
	$(PYTHON) -m venv $(VENV) || { \
	    rm -rf $(VENV) && \
	    echo "python3 -m venv failed; installing Debian's python3-venv" && \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv && \
	    $(PYTHON) -m venv $(VENV); }

# The packages: (re)installed whenever pyproject.toml is newer than the stamp.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,test,spark]'
	touch $@

# `ksi dev` keeps its state in .ksi-dev/ across runs: `make run ARGS=--reset` (or `ksi dev --reset`) starts afresh.
run: venv kcat
	$(VENV)/bin/ksi dev $(ARGS)

kcat:
	bash scripts/install-kcat.sh

# Java, Debian's jarjar and JDBC drivers, PostgreSQL, and the relocated Jackson jar for the Spark pipeline.
spark-deps: venv
	bash scripts/install-spark-deps.sh $(PY)

# Debian kcat and prometheus, npm kafkajs, and the Java, Flink and Go clients (scripts/install-jvm-deps.sh)
# for tests/integration; the scripts are idempotent.
test-deps: spark-deps
	bash scripts/install-test-deps.sh

# The lint first: a finding fails the build in seconds, before the installs and the suite.
test: venv lint test-deps
	$(PY) -m pytest -q tests

# The cold benchmark needs only the venv (its broker, registry and catalog are Python packages).
bench: venv
	$(PY) bench/cold.py $(BENCH_ARGS)

bench-passthrough: venv test-deps
	$(PY) bench/passthrough.py $(PASSTHROUGH_ARGS)

# gcc builds bench/relay_native.c; tansu comes with the test extra (test-deps).
bench-hop: venv test-deps
	$(PY) bench/hop.py $(HOP_ARGS)

# Java and the Iceberg jars for the Spark engine's figures (spark-deps).
bench-archive: venv spark-deps
	$(PY) bench/archive.py $(BENCH_ARCHIVE_ARGS)

# HAProxy comes from scripts/install-test-deps.sh (test-deps).
bench-scaleout: venv test-deps
	$(PY) bench/scaleout.py $(SCALEOUT_ARGS)

# Mixed producers, cold and hot consumers, a moving log start and a broker kill -9 half way; exits non-zero
# on any lost or duplicated record.
soak: venv
	$(PY) scripts/soak.py --seconds $(SOAK_SECONDS) $(SOAK_ARGS)

# Random and mutated frames against the proxy and the sans-IO layer; exits non-zero on a falsifying input
# (hypothesis prints it and replays it first next time) or on memory growth.
fuzz: venv
	$(PY) scripts/fuzz.py --seconds $(FUZZ_SECONDS)

# ruff and mypy come with the [test] extra (make venv); mypy keeps its cache in .mypy_cache.
LINT_DIRS := ksi protocol tests bench scripts examples

lint: venv
	$(VENV)/bin/ruff check $(LINT_DIRS)
	$(PY) -m mypy

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) tests/integration/clients/node_modules .cache
