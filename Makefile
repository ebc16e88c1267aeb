# Two commands for a new user: `make up` (the whole stack and its pipeline) and `make test`.
# STACK=native|docker picks how `make up` runs; by default Docker Compose when a Docker engine
# answers, else real native processes (see README).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
STACK ?= $(shell docker info >/dev/null 2>&1 && echo docker || echo native)

.PHONY: setup up down clean status logs test bench

setup: $(INSTALLED)
	@$(PY) -m stack.provision

# A new stage package needs a reinstall too: the editable install maps packages when it is made.
$(INSTALLED): pyproject.toml $(wildcard 0*/*/__init__.py)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing Python dependencies into $(VENV) ..."
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $@

up: setup
ifeq ($(STACK),docker)
	@test -f .env || cp .env.example .env
	docker compose up -d --wait
else
	@$(PY) -m stack up
endif

down:
ifeq ($(STACK),docker)
	docker compose down
else
	@test ! -x $(PY) || $(PY) -m stack down
endif

clean:
ifeq ($(STACK),docker)
	docker compose down -v
else
	@test ! -x $(PY) || $(PY) -m stack clean
endif

status: setup
	@$(PY) -m stack status

logs: setup
	@$(PY) -m stack logs $(SERVICE)

test: setup
	@$(PY) -m pytest $(PYTEST_ARGS)

bench: setup
	@$(PY) -m local_stream_buffer.bench
