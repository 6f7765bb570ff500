# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing and install the package with pinned dependencies
# (torch and torchvision come from this machine's local wheel files through plain pip).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
RUNS   ?= runs

.PHONY: install demo test bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m profilednn demo -o $(RUNS)

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/bench_parse.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
