# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing and install the package with pinned dependencies
# (torch and torchvision come from this machine's local wheel files through plain pip).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
RUNS   ?= runs

.PHONY: install demo test bench clean chromium

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m profilednn demo -o $(RUNS)

test: $(STAMP) chromium
	$(PY) -m pytest -q

# The HTML report is tested in a real headless Chromium (Debian's package); install it
# when missing and we are root, else say why the browser tests will be skipped.
chromium:
	@if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "chromium is missing and we are not root: the browser tests will be skipped"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	  echo "chromium is missing and there is no apt-get: the browser tests will be skipped"; \
	else \
	  echo "installing Debian's chromium for the browser tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	    || echo "could not install chromium: the browser tests will be skipped"; \
	fi

bench: $(STAMP)
	$(PY) benchmarks/bench_parse.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
