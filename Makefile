# Two commands for a new user: `make up` (the whole stack and its pipeline) and `make test`.
# STACK=native|docker picks how `make up` runs; by default Docker Compose when a Docker engine
# answers, else real native processes (see README).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
# Compose v2 (`docker compose`, or a docker-compose binary of version 2): the Compose file uses its profiles and
# `up --wait`. Version 1 (Debian bookworm's docker-compose) cannot run it, so a host with only that runs natively.
# Both searches run at most once per make (the first use keeps the answer), and Compose's only where Docker answers.
COMPOSE_V2_FOUND = $(eval COMPOSE_V2_FOUND := $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" \
	|| { docker-compose version --short 2>/dev/null | grep -q '^v\?2' && echo docker-compose; }))$(COMPOSE_V2_FOUND)
ifeq ($(origin STACK),undefined)
STACK := $(if $(shell docker info >/dev/null 2>&1 && echo answers),$(if $(COMPOSE_V2_FOUND),docker,native),native)
endif
# Expanded only by the targets that run Compose (STACK=docker); COMPOSE="docker compose" on the command line skips
# the search.
COMPOSE = $(or $(COMPOSE_V2_FOUND),$(error STACK=docker needs Docker Compose v2 (`docker compose version` fails \
	here, and docker-compose is not version 2): install Docker's compose plugin, or run natively with STACK=native))
# JOINER=spark (the default) or lsb, the standalone joiner. Natively `up` without JOINER keeps the joiner the state
# dir runs, and with the other one stops it and hands its input position over (ops/README.md). Compose runs the Spark joiner unless told
# otherwise and the standalone one with the profile lsb: `up` enables the profile and scales the joiner not
# chosen to zero, so exactly one runs, also after switching.
COMPOSE_UNUSED_JOINER = $(if $(filter lsb,$(JOINER)),spark-joiner,lsb-joiner)
# Native: TOPOLOGY=single (the default: one Kafka broker, one instance of each stage), cluster (three Kafka nodes, a
# Spark standalone master and two workers, two instances of each scaled stage) or hosts (the cluster placed on ten
# hosts, network namespaces, by ops/stack/hosts.toml; as root), read by `python -m stack` from the
# environment, where make puts a variable given on its command line. The state dir remembers the topology its
# `up` ran: `status`, `logs`, `down` and `clean` act on it without TOPOLOGY.
# Compose's topology is a profile: single (the default) or cluster (three Kafka nodes, a Spark standalone
# cluster with the Spark joiner submitted to it, two DB connectors). The cluster runs the Spark joiner only.
COMPOSE_UP = $(if $(filter hosts,$(TOPOLOGY)),$(error TOPOLOGY=hosts builds its hosts as network namespaces: \
	it runs natively, STACK=native)) \
	$(if $(filter cluster,$(TOPOLOGY)),\
	$(if $(filter lsb,$(JOINER)),$(error JOINER=lsb: the Compose cluster runs the Spark joiner only),\
	$(COMPOSE) --profile cluster up -d --build --wait),\
	$(COMPOSE) --profile single --profile lsb up -d --build --wait --scale $(COMPOSE_UNUSED_JOINER)=0)
# down and clean stop every profile's services, whichever topology runs (clean: the simulator's replay log too).
COMPOSE_ALL = $(COMPOSE) --profile single --profile lsb --profile cluster --profile tools
# With Docker the host needs Docker and make only: the pipeline's image runs every tool. Before Compose can read
# its file (.env must exist), the image makes .env and the certificates in the checkout, as the host's user;
# afterwards the tools are services of the profile tools, run once (`make data`, `make report`).
DOCKER_TOOLS = docker run --rm --user "$$(id -u):$$(id -g)" -v "$(CURDIR):/repo" -w /repo machine-data-pipeline
COMPOSE_TOOLS = $(COMPOSE) --profile tools run --rm
# What a target needs first: natively the virtualenv and the servers' packages (`make setup`); with Docker nothing.
SETUP = $(if $(filter docker,$(STACK)),,setup)
# SECURITY=on: the native stack with authentication and least privilege (docs/security.md); it stays secure
# until `make clean`. STACK_TLS=on adds TLS to Kafka's listener. `python -m stack` reads both.
export SECURITY STACK_TLS

# Every stage's benchmark, in pipeline order, the joiners beside their peers (join_peers) and the dashboards at plant
# size; a benchmark with flags is its module and flags joined by commas. `make bench BENCHMARKS=benchmarks.db_connector`
# runs one. Each records its figures in benchmarks/results/ (benchmarks/results.py), from which the tables of
# docs/benchmarks.md are rendered.
BENCHMARKS ?= benchmarks.join_engine benchmarks.mosquitto_persistence benchmarks.mqtt_publish \
	benchmarks.stream_connector benchmarks.stream_connector,--instances,2 \
	benchmarks.kafka_joiner benchmarks.spark_joiner benchmarks.join_peers benchmarks.db_connector benchmarks.dashboards
# These need none of the stack's servers (Mosquitto's benchmark runs brokers of its own): they run first, if listed,
# before the servers start, so that no booting JVM shares their cores.
BENCHMARKS_WITHOUT_SERVERS = benchmarks.join_engine benchmarks.mosquitto_persistence

# Last, the whole pipeline's capacity with each joiner (docs/soak.md): three stacks of its own, about an hour.
ifeq ($(origin BENCHMARKS),file)
BENCHMARKS += benchmarks.capacity
endif

.PHONY: setup up down clean status logs restart grow specs data report dashboards test explore bench bench-topology bench-links reliability chaos spark-package
.PHONY: soak

setup: $(INSTALLED)
	@$(PY) -m stack.provision
	@$(PY) -m spark_joiner.build_class_archive

# A new stage package needs a reinstall too: the editable install maps packages when it is made.
$(INSTALLED): pyproject.toml $(wildcard core/*/__init__.py ops/*/__init__.py 0*/*/__init__.py)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing Python dependencies into $(VENV) ..."
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[test]' > $(VENV)/pip-install.log 2>&1 \
		|| { tail -30 $(VENV)/pip-install.log; exit 1; }
	@touch $@

up: $(SETUP)
ifeq ($(STACK),docker)
	docker build --quiet --tag machine-data-pipeline . >/dev/null
	@$(DOCKER_TOOLS) python ops/compose/env_file.py .env
	@$(DOCKER_TOOLS) python ops/compose/certificates.py .certs
	$(COMPOSE_UP)
	@echo "Grafana: http://127.0.0.1:3000 (user admin; its password is GRAFANA_ADMIN_PASSWORD in .env)"
else
	@$(PY) -m stack up
endif

down:
ifeq ($(STACK),docker)
	$(COMPOSE_ALL) down
else
	@test ! -x $(PY) || $(PY) -m stack down
endif

clean:
ifeq ($(STACK),docker)
	$(COMPOSE_ALL) down -v
else
	@test ! -x $(PY) || $(PY) -m stack clean
endif

# JSON=1: the same facts as one JSON document (`python -m stack status --json`; with Docker, Compose's).
status: $(SETUP)
ifeq ($(STACK),docker)
	@$(COMPOSE_ALL) ps $(if $(filter 1 yes true on,$(JSON)),--format json)
else
	@$(PY) -m stack status $(if $(filter 1 yes true on,$(JSON)),--json)
endif

# SERVICE=<name> (or supervisord): its last LINES lines (40); FOLLOW=1 then every line written to it, until Ctrl-C.
# LINES counts only from make's command line: shells keep the terminal's height in an environment variable LINES.
LOG_LINES = $(if $(filter command line,$(origin LINES)),$(LINES))
# With Docker, a service of the Compose file, or all of them without SERVICE.
logs: $(SETUP)
ifeq ($(STACK),docker)
	@$(COMPOSE_ALL) logs --tail $(or $(LOG_LINES),40) $(if $(filter 1 yes true on,$(FOLLOW)),--follow) $(SERVICE)
else
	@$(PY) -m stack logs $(SERVICE) $(if $(LOG_LINES),--lines $(LOG_LINES)) $(if $(filter 1 yes true on,$(FOLLOW)),--follow)
endif

# SERVICE=<name>: stopped and started again, healthy (a service of the stack that runs).
restart: $(SETUP)
ifeq ($(STACK),docker)
	@$(COMPOSE_ALL) restart $(SERVICE)
else
	@$(PY) -m stack restart $(SERVICE)
endif

# TOPIC=<name> PARTITIONS=<count>: partitions added to a topic of the running stack (never taken away), then the
# pipeline followed until it runs on them (docs/operations.md, "Partitions added").
grow: $(SETUP)
	@$(PY) -m stack grow $(TOPIC) $(PARTITIONS)

# SPECS=<file>: another join-spec file applied to the running stack: checked first (refused with its error before
# anything stops), then the joiners restarted with it; a spec added joins from their position on
# (docs/operations.md, "Join specs changed").
specs: $(SETUP)
	@$(PY) -m stack specs $(SPECS)

# Every Kafka node of the running cluster in turn, then every Spark worker, each back in sync before the next
# (TOPOLOGY=cluster or hosts, natively; JSON=1: the steps as one JSON document).
.PHONY: rolling-restart
rolling-restart: $(SETUP)
ifeq ($(STACK),docker)
	@echo "make rolling-restart runs the native cluster (TOPOLOGY=cluster or hosts); with Compose, \`docker compose restart kafka-1\`, one node at a time" >&2; exit 1
else
	@$(PY) -m stack rolling-restart $(if $(filter 1 yes true on,$(JSON)),--json)
endif

# Replays events into the running stack: RATE=rows/s (0 = as fast as lossless delivery allows),
# N=rows (default: the whole file), DATA_ARGS for any other simulator flag (see --help).
SIMULATOR_ARGS = --ending-now $(if $(RATE),--rate $(RATE)) $(if $(N),--limit $(N)) $(DATA_ARGS)
# Then the dashboards' history of the replayed rows: InfluxDB's continuous queries keep that of the last minutes only.
data: $(SETUP)
ifeq ($(STACK),docker)
	@$(COMPOSE_TOOLS) simulator python -m simulator $(SIMULATOR_ARGS)
	@$(COMPOSE_TOOLS) history
else
	@$(PY) -m stack run -- $(PY) -m simulator $(SIMULATOR_ARGS)
	@$(PY) -m stack run -- $(PY) -m grafana_report.history
endif

# The dashboards' panels as PNG files in reports/ (with Docker as the host's user, who owns the folder).
report: $(SETUP)
ifeq ($(STACK),docker)
	@mkdir -p reports
	@$(COMPOSE_TOOLS) --user "$$(id -u):$$(id -g)" report
else
	@$(PY) -m stack run -- $(PY) -m grafana_report --out reports/
endif

# The two dashboards as live web pages (Bokeh), natively: http://127.0.0.1:5006/machine-power and /pipeline-health,
# refreshed every 5 s, until Ctrl-C. DASHBOARDS_ARGS for any other flag (--port, --refresh-s, --window-s; see --help).
# Not part of `make up`: the stack's processes stay the pipeline's. With Docker, Grafana shows the same dashboards.
dashboards: $(SETUP)
ifeq ($(STACK),docker)
	@echo "With Docker, Grafana serves the dashboards: http://127.0.0.1:3000 (user admin; its password is GRAFANA_ADMIN_PASSWORD in .env)"
else
	@$(PY) -m stack run -- $(PY) -m live_dashboards $(DASHBOARDS_ARGS)
endif

# A plant's week through the whole running pipeline (or one brought up as `make up` would: JOINER=, TOPOLOGY=) for
# MINUTES (45): a backfill of its past at the pipeline's pace, then live, with faults; verdicts at the end (exit status
# 0 only if all hold) and a report in reports/soak-<run>/. SOAK_ARGS for any other flag (--no-faults, --machines ...).
soak: $(SETUP)
ifeq ($(STACK),docker)
	@echo "make soak runs natively (its faults go through the native stack's supervisord): STACK=native"; exit 1
else
	@$(PY) -m stack run -- $(PY) -m soak $(if $(MINUTES),--minutes $(MINUTES)) $(SOAK_ARGS)
endif

# The tests run in TEST_WORKERS processes (pytest-xdist): most of their time goes to waiting (for outages, timeouts,
# servers), not to the cores. A test file's tests stay in one process, in order, with its module fixtures made once
# (--dist loadfile); the servers are shared by all (tests/session_servers.py); a test marked `alone` runs with no
# other beside it (tests/conftest.py). TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: setup
	@$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The property tests (hypothesis) drawing new examples: `make test` draws the same ones on every run (derandomized,
# as CI must), this fresh ones on each, and keeps every failing example in .hypothesis/examples, where the next run
# tries it first (tests/conftest.py). EXPLORE_RUNS=n: n runs in a row, stopping at the first that fails.
EXPLORE_RUNS ?= 1
explore: setup
	@for run in $$(seq $(EXPLORE_RUNS)); do \
		HYPOTHESIS_EXPLORE=1 $(PY) -m pytest -n $(TEST_WORKERS) tests/unit $(PYTEST_ARGS) || exit 1; \
	done

# The minutes-long reliability runs: outages, ten starts from nothing per joiner, restart bounds, chaos (of
# both topologies).
reliability: setup
	@env -u TOPOLOGY $(PY) -m pytest -m slow tests/reliability $(PYTEST_ARGS)

# The full chaos run alone (a shorter seeded one is part of `make test`); TOPOLOGY=cluster, the cluster's;
# TOPOLOGY=hosts, network faults across the hosts.
# Each run brings up a stack of its own (the chosen topology is the test's, not the environment's).
CHAOS_TESTS = $(if $(filter cluster,$(TOPOLOGY)),tests/reliability/test_cluster_chaos.py,\
	$(if $(filter hosts,$(TOPOLOGY)),tests/reliability/test_hosts_chaos.py,tests/reliability/test_chaos.py))
chaos: setup
	@env -u TOPOLOGY $(PY) -m pytest -m slow $(CHAOS_TESTS) $(PYTEST_ARGS)

# The benchmarks that need servers bring up the native ones (a no-op when they run). Whatever ran, the tables of the
# docs are rendered from the results at the end; the first benchmark that fails ends the run, and make with it.
BENCH_FIRST = $(filter $(BENCHMARKS_WITHOUT_SERVERS),$(BENCHMARKS))
BENCH_THEN = $(filter-out $(BENCHMARKS_WITHOUT_SERVERS),$(BENCHMARKS))
bench: setup
	@$(PY) -c 'import sys; from pipeline_core import credentials; credentials.is_secure() and sys.exit( \
		"make bench measures an unauthenticated stack, and this state dir is secure (" \
		+ str(credentials.credentials_file()) + "): run it on another STACK_STATE_DIR with other ports, " \
		"or after make clean")'
	@status=0; servers=; for benchmark in $(BENCH_FIRST) $(BENCH_THEN); do \
		case " $(BENCHMARKS_WITHOUT_SERVERS) " in *" $$benchmark "*) ;; *) \
			[ -n "$$servers" ] || $(PY) -m stack up --servers-only || { status=1; break; }; servers=up;; \
		esac; \
		command="$${benchmark//,/ }"; echo; echo "=== $$command ==="; \
		PYTHONPATH=$(CURDIR) $(PY) -m $$command || { status=1; break; }; \
	done; \
	PYTHONPATH=$(CURDIR) $(PY) -m benchmarks.render || status=1; exit $$status

# TOPOLOGY=single against cluster on this host, in one run: each brought up on ports of its own (free ones, or
# BENCH_PORTS=first-last), the same rows through each (docs/scaling.md).
bench-topology: setup
	@env -u TOPOLOGY PYTHONPATH=$(CURDIR) $(PY) -m benchmarks.topology $(BENCH_ARGS)
	@PYTHONPATH=$(CURDIR) $(PY) -m benchmarks.render

# The cluster across hosts (TOPOLOGY=hosts, as root) with the devices' link to Mosquitto undelayed and then with a
# round-trip delay (BENCH_ARGS="--round-trip-ms 100"), the same rows through each, in one run (docs/scaling.md).
bench-links: setup
	@env -u TOPOLOGY PYTHONPATH=$(CURDIR) $(PY) -m benchmarks.slow_links $(BENCH_ARGS)
	@PYTHONPATH=$(CURDIR) $(PY) -m benchmarks.render

# The Spark joiner as spark-submit takes it, in build/spark-joiner/: its entry script, the --py-files archive of
# the packages its driver and executors import, and the Kafka connector jars for --jars
# (06_spark_joiner/README.md, "Submit to a cluster").
spark-package: setup
	@$(PY) -m spark_joiner.package build/spark-joiner
