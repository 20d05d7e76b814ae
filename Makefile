# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NATIVE_STAMP := $(VENV)/.native
# The compiled snapshot conversion (native/) is built with cargo (rustup puts it in ~/.cargo/bin).
export PATH := $(HOME)/.cargo/bin:$(PATH)
KAFKA_POM := mongocdc_devstack/kafka/pom.xml
KAFKA_JARS := .jars/kafka
KAFKA_STAMP := $(KAFKA_JARS)/.complete
SPARK_JARS_DIR := .jars/spark
SPARK_JARS_STAMP := $(SPARK_JARS_DIR)/.installed
DRIVERS_JAVA := tests/drivers/java
DRIVERS_NODE := tests/drivers/node
DRIVERS_JAR := $(DRIVERS_JAVA)/target/driver-check.jar
DRIVERS_NODE_STAMP := $(DRIVERS_NODE)/node_modules/.installed
DEBEZIUM := tests/compat/debezium
DEBEZIUM_VERSIONS := 3.4.1.Final 3.6.1.Final
DEBEZIUM_STAMP := $(DEBEZIUM)/target/.complete
PYMONGO_VERSION := $(shell sed -n 's/.*"pymongo==\([^"]*\)".*/\1/p' pyproject.toml)
CONFORMANCE_STAMP := .local/conformance/pymongo-$(PYMONGO_VERSION)/.complete

.PHONY: soak wheels setup test test-fast reliability lint docs demo dev bench conformance clean

setup: $(STAMP) $(NATIVE_STAMP) $(KAFKA_STAMP) $(SPARK_JARS_STAMP) $(DRIVERS_JAR) $(DRIVERS_NODE_STAMP) $(DEBEZIUM_STAMP) $(CONFORMANCE_STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# mongocdc_native: the compiled conversion (PyO3, built by maturin with cargo), a dependency of mongocdc,
# so it is installed first; rebuilt when its sources change.
$(NATIVE_STAMP): $(VENV)/bin/python native/Cargo.toml native/Cargo.lock native/pyproject.toml $(wildcard native/src/*.rs) native/mongocdc_native.pyi
	$(PY) -m pip install --quiet ./native
	touch $@

$(STAMP): pyproject.toml $(NATIVE_STAMP)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The wheels a user installs (`pip install --find-links dist 'mongocdc[all]'`): mongocdc and mongocdc-native,
# and mongocdc-native's sdist (pip builds it where no wheel fits and Rust is present).
wheels: $(VENV)/bin/python
	rm -rf dist
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist . ./native
	$(PY) -m build --sdist --outdir dist native

# The Maven steps run one after another (order-only prerequisites chain them: Maven 3.8 does not lock its local
# repository between processes); `make -j setup` (CI) builds the Python side, the compiled module and the Node
# driver beside them.

# Kafka broker jars from Maven Central; re-fetched only when the pom changes.
$(KAFKA_STAMP): $(KAFKA_POM)
	rm -rf $(KAFKA_JARS)
	mvn -q -B -f $(KAFKA_POM) dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(KAFKA_JARS)
	touch $@

# Delta Lake and the Spark Kafka source (pyspark ships Spark, Scala and Hadoop themselves).
$(SPARK_JARS_STAMP): mongocdc_core/tables/pom.xml | $(KAFKA_STAMP)
	rm -rf $(SPARK_JARS_DIR)
	mvn -q -B -f mongocdc_core/tables/pom.xml dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(SPARK_JARS_DIR)
	touch $@

# The official Java and Node.js drivers' checks against the emulator (tests/drivers).
$(DRIVERS_JAR): $(DRIVERS_JAVA)/pom.xml $(wildcard $(DRIVERS_JAVA)/src/main/java/mongocdc/drivers/*.java) $(wildcard $(DRIVERS_JAVA)/src/main/resources/*) \
  | $(SPARK_JARS_STAMP)
	rm -rf $(DRIVERS_JAVA)/target
	mvn -q -B -ntp -f $(DRIVERS_JAVA)/pom.xml package
	touch $@

# The real Debezium MongoDB connector, embedded, for the compatibility suite (tests/compat) and
# benchmarks/bench_debezium.py: the runner jar once, then one class path per pinned connector version.
$(DEBEZIUM_STAMP): $(DEBEZIUM)/pom.xml $(wildcard $(DEBEZIUM)/src/main/java/mongocdc/compat/*.java) | $(DRIVERS_JAR)
	rm -rf $(DEBEZIUM)/target
	mvn -q -B -ntp -f $(DEBEZIUM)/pom.xml package
	for v in $(DEBEZIUM_VERSIONS); do \
	  mvn -q -B -ntp -f $(DEBEZIUM)/pom.xml dependency:copy-dependencies -Ddebezium.version=$$v \
	    -DoutputDirectory=$(CURDIR)/$(DEBEZIUM)/target/debezium-$$v || exit 1; \
	done
	touch $@

$(DRIVERS_NODE_STAMP): $(DRIVERS_NODE)/package.json $(DRIVERS_NODE)/package-lock.json
	cd $(DRIVERS_NODE) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# pymongo's own test suite (its sdist from the package index) for the conformance job (tests/conformance).
$(CONFORMANCE_STAMP): $(STAMP)
	$(PY) -m tests.conformance.pymongo_suite --fetch-only

# The whole suite on three workers (on two cores: much of it waits on brokers, daemons and Spark jobs; 31
# minutes against 38 on two workers). A file, and the tests of tests/tables (the Spark tests) but for its two
# longest files, stay on one worker each, and the longest of these groups are handed out first
# (tests/conftest.py groups and orders them; --no-loadscope-reorder keeps that order). Every run prints its 30
# slowest tests. The soak's CI-size test (marker soak, tests/soak: about 6 minutes) runs after the rest, alone:
# it runs a whole deployment that fills the machine, and its figures (freshness, CPU share) are of that
# deployment, not of other tests.
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -n 3 --dist loadgroup --no-loadscope-reorder --durations=30

test: setup
	$(PYTEST) -m "not soak" tests
	$(PY) -m pytest -q -p no:cacheprovider -s -m soak tests/soak

# Everything that needs neither Kafka, Spark, the Dagster daemon, pymongo's suite nor Debezium.
test-fast: setup
	$(PYTEST) -m "not kafka and not spark and not daemon and not conformance and not compat and not slow and not bench and not reliability" tests

# The fault and bad-input trials at full size (make test runs them small); prints one table of figures.
reliability: setup
	MONGOCDC_RELIABILITY=full $(PYTEST) tests/reliability

lint: setup docs
	$(PY) -m ruff check mongocdc_core mongocdc_dagster mongocdc_devstack tests benchmarks
	$(PY) -m mypy mongocdc_core mongocdc_dagster mongocdc_devstack

# The documentation site (docs/, mkdocs.yml) into .local/site; strict: a broken link, a missing anchor, a
# figure results.json does not hold, or a README link to no file fails it.
docs: setup
	$(PY) -m mkdocs build --strict --quiet

# Local stack: emulated replica set on 127.0.0.1:27117 (data in .local/mongo), demo data when empty,
# and `dagster dev` on http://127.0.0.1:3000 with DAGSTER_HOME=.local/dagster (kept when already set).
# Other ports and home: make dev ARGS="--port 27200 --dagster-port 3100 --home /tmp/cdc". Ctrl-C stops everything.
dev: setup
	$(PY) -m mongocdc_dagster.local_stack $(ARGS)

demo: setup
	$(PY) -m mongocdc_devstack.demo

# pymongo's test suite against the emulator, file by file, with pass counts and rates.
conformance: setup
	$(PY) -m tests.conformance.pymongo_suite

# The deployment left running under writers and faults (a PostgreSQL instance, 20 collections, 1-minute
# windows) for SOAK_MINUTES (default 30); SOAK_ARGS=--sharded for the sharded cluster; benchmarks/soak.json.
# make test runs it at CI size (tests/soak/test_soak.py).
SOAK_MINUTES ?= 30
soak: setup
	SOAK_MINUTES=$(SOAK_MINUTES) $(PY) -m benchmarks.soak $(SOAK_ARGS)

# Every benchmark in its own process; one table of ratios, written to benchmarks/results.json.
bench: setup
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) build *.egg-info native/target .pytest_cache .mypy_cache .ruff_cache $(DRIVERS_JAVA)/target $(DRIVERS_NODE)/node_modules \
	  $(DEBEZIUM)/target
