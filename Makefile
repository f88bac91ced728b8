# Switchboard: `make run` starts everything on SQLite; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-postgres bench migrate schema clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet '.[dev]'
	touch $(STAMP)

run: export DEBUG ?= 1
run: $(STAMP)
	@test -n "$$DATABASE_URL" || echo "Database: SQLite in var/ (set DATABASE_URL for PostgreSQL)"
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py bootstrap
	$(PY) manage.py serve

migrate: $(STAMP)
	$(PY) manage.py migrate --noinput

test: $(STAMP)
	DEBUG=1 $(PY) -m pytest $(PYTEST_ARGS)

# The same suite on PostgreSQL + Redis (both must be running).
test-postgres: $(STAMP)
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/0} DEBUG=1 $(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/run.py $(BENCH_ARGS)

schema: $(STAMP)
	DEBUG=1 $(PY) manage.py spectacular --validate --file var/openapi.yaml

clean:
	rm -rf $(VENV) var .pytest_cache
