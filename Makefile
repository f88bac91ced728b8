# Switchboard: `make run` starts everything on SQLite; `make test` runs the suite.
# Switchboard runs on Python 3.11: python3.11 when it is on the PATH, else python3 (checked below).
PYTHON ?= $(shell command -v python3.11 2>/dev/null || echo python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
VAR := $(or $(SWITCHBOARD_VAR_DIR),var)

.PHONY: run test test-postgres bench chaos cluster migrate schema receiver reset clean

$(STAMP): pyproject.toml client/pyproject.toml
	@test -x $(PY) || $(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11) and \
		f"Switchboard needs Python 3.11, and $(PYTHON) is {sys.version.split()[0]}: run make again with PYTHON=/path/to/python3.11")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet '.[dev]'
	$(PY) -m pip install --quiet -e ./client
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

# The fault matrix (docs/reliability.md): a PostgreSQL and a Redis of its own,
# two nodes, two workers, HTTPS receivers, faults; exits non-zero on any loss.
chaos: $(STAMP)
	$(PY) -m bench.chaos $(CHAOS_ARGS)

# The scale-out topology on this machine (docs/deploy.md): needs DATABASE_URL
# (PostgreSQL) and REDIS_URL.
cluster: $(STAMP)
	DEBUG=$${DEBUG:-1} $(PY) manage.py migrate --noinput -v 0
	DEBUG=$${DEBUG:-1} $(PY) manage.py cluster $(CLUSTER_ARGS)

schema: $(STAMP)
	DEBUG=1 $(PY) manage.py spectacular --validate --file var/openapi.yaml

# The example HTTPS receiver on 127.0.0.1:8443 with a throwaway certificate
# (docs/webhooks.md); it prints the settings to restart `make run` with.
receiver: $(STAMP)
	$(PY) -m webhooks.example_receiver $(RECEIVER_ARGS)

# A fresh database (stop `make run` first); keeps .venv, the development key
# and the receiver's certificate. On PostgreSQL (DATABASE_URL) it empties every table.
reset: $(STAMP)
	@if [ -n "$$DATABASE_URL" ]; then $(PY) manage.py flush --noinput; \
	else rm -f $(VAR)/switchboard.sqlite3*; fi
	@echo "Fresh database: the next \`make run\` creates the first admin again."

# Everything `make run` and `make test` made: .venv, var/ (database, development key, receiver certificate),
# and what installing the packages leaves.
clean:
	rm -rf $(VENV) var .pytest_cache build *.egg-info client/build client/*.egg-info
