# Two entry points a newcomer needs: `make serve` and `make test`.
# Both create .venv and install what is missing (torch pinned to the CPU build
# for development; a GPU host installs nnhost into its own CUDA environment).

VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: install serve test bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $@

serve: install
	$(BIN)/nnhost serve --demo $(ARGS)

test: install
	$(BIN)/python -m pytest -q $(ARGS)

bench: install
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) nnhost-data
