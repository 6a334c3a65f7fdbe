# The entry points a newcomer needs: `make serve`, `make check` (the fast loop: lint,
# types and the unit tests) and `make test` (everything). They create .venv and install
# what is missing (torch pinned to the CPU build for development; a GPU host installs
# nnhost into its own CUDA environment).

VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: install runtimes browser services postgres clients serve check test bench docs clean

install: $(VENV)/.installed runtimes browser

# The environments in which other nnsight versions' clients are served (nnhost.runtimes
# lists them): each over .venv's packages, holding only that nnsight. Built once, inside
# .venv; `nnhost runtimes --again` rebuilds them.
runtimes: $(VENV)/.installed
	$(BIN)/python -m nnhost.runtimes

$(VENV)/.installed: pyproject.toml requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $@

# The browser tests drive Debian's chromium: install it when it is missing and we can
# (root with apt). A failure here is reported and the browser tests then fail in CI.
browser:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing chromium for the browser tests ..."; \
		(bash .ci/apt-install chromium) \
			|| echo "Could not install chromium: the browser tests will fail." >&2; \
	fi

# The cluster-part tests start Debian's redis-server on loopback (never a system
# service): install the package when it is missing and we can, as for chromium.
# The front-end tests run the deployment guide's nginx site in front of a server,
# started by the suite on loopback; a service the package starts is stopped.
services:
	@if ! command -v redis-server >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing redis-server for the tests ..."; \
		(bash .ci/apt-install redis-server) \
			|| echo "Could not install redis-server: the Redis tests will fail." >&2; \
	fi
	@if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing nginx for the front-end tests ..."; \
		(bash .ci/apt-install nginx-light \
			&& (service nginx stop >/dev/null 2>&1 || true)) \
			|| echo "Could not install nginx: the front-end tests will fail." >&2; \
	fi

# The database tests also run on PostgreSQL: Debian's server binaries, started by the
# suite itself as an unprivileged user (tests/services.py). Nothing is left running.
postgres:
	@if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing postgresql for the database tests ..."; \
		(bash .ci/apt-install postgresql \
			&& (service postgresql stop >/dev/null 2>&1 || true)) \
			|| echo "Could not install postgresql: the PostgreSQL tests will be skipped (fail in CI)." >&2; \
	fi

# Client environments of the nnsight versions that tests/test_client_versions.py drives:
# each a venv over .venv's packages (a .pth names them) holding only that nnsight and
# what it needs beyond them, so that it costs seconds and no second torch.
CLIENT_VERSIONS := 0.8.0 0.7.0 0.6.3 0.5.15
CLIENTS := .clients

clients: $(foreach version,$(CLIENT_VERSIONS),$(CLIENTS)/nnsight-$(version)/.installed)

$(CLIENTS)/nnsight-%/.installed: $(VENV)/.installed
	rm -rf $(CLIENTS)/nnsight-$*
	$(BIN)/python -m venv --without-pip $(CLIENTS)/nnsight-$*
	$(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
		> "$$($(CLIENTS)/nnsight-$*/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/nnhost-venv.pth"
	$(BIN)/python -m pip --python $(CLIENTS)/nnsight-$*/bin/python install --quiet nnsight==$* 2>&1 \
		| grep -v "^WARNING: Location\|dependency resolver\|nnhost .* requires nnsight" || true
	$(CLIENTS)/nnsight-$*/bin/python -c "import nnsight, sys; assert nnsight.__version__ == '$*', nnsight.__version__"
	touch $@

serve: install
	$(BIN)/nnhost serve --demo $(ARGS)

# The fast loop: ruff, mypy and the tests marked `unit` (no server, service or browser;
# tests/tiers.py says which, from what each test starts). No apt installs.
check: $(VENV)/.installed
	$(BIN)/python -m ruff check src tests benchmarks
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider -m unit $(ARGS)

test: install services postgres clients
	$(BIN)/python -m ruff check src tests benchmarks
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q $(ARGS)

bench: install
	$(BIN)/python benchmarks/suite.py $(ARGS)

# docs/configuration.md's tables of settings, rendered from their declarations in
# src/nnhost/config.py (tests/test_settings_docs.py fails while they differ).
docs: $(VENV)/.installed
	$(BIN)/nnhost settings --write docs/configuration.md

clean:
	rm -rf $(VENV) $(CLIENTS) nnhost-data
