# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing and install the package with the exact versions of
# constraints.txt (pyproject.toml states ranges; torch and torchvision come from this
# machine's local wheel files through plain pip). `make test` also runs the compatibility
# check (`make compat`): the built wheel installed beside an older torch, without the zoo.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
RUNS   ?= runs
LOCK   := constraints.txt
PIP_QUIET := --quiet --disable-pip-version-check

# The compatibility venv: a user's environment with the oldest supported torch (the CPU
# build from the local wheel files) and no torchvision, into which the wheel is installed.
COMPAT       ?= .venv-compat
COMPAT_PY    := $(COMPAT)/bin/python
COMPAT_TORCH ?= 2.13.0
COMPAT_STAMP := $(COMPAT)/.torch-$(COMPAT_TORCH)-stamp
# The part of the suite that runs there: packaging, every no-zoo verb end to end, the
# parser, capture of a user script, report, projection (tests needing the zoo are marked).
CAPTURE      := tests/test_capture.py
COMPAT_TESTS ?= tests/test_packaging.py tests/test_without_zoo.py tests/verbose \
                $(CAPTURE)::test_script_that_raises_keeps_failed_run \
                $(CAPTURE)::test_script_without_optimizer_is_profiled_by_wall_time \
                $(CAPTURE)::test_api_capture_context $(CAPTURE)::test_cli_profile_prints_table_and_run_path \
                tests/test_report.py tests/test_projection_model.py tests/test_projection_replay.py

.PHONY: install demo test compat compat-oldest dist lock bench verify clean chromium

$(STAMP): pyproject.toml $(LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_QUIET) -c $(LOCK) -e '.[test,zoo]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m profilednn demo -o $(RUNS)

# Tests marked cpu_facing run on this CPU and as each recorded CPU of tests/cpus/ (ids
# [real], [intel-amx-2core], ...); PROFILEDNN_TEST_CPU=NAME runs the whole suite as NAME.
# --durations: the 25 slowest tests, so that a suite past its 15-minute guide says where it went.
# TEST_WORKERS pytest-xdist workers (2: this project's 2-core machines): most tests wait on one
# child process at a time, so one worker keeps about one core busy; --dist loadfile gives a
# test file to one worker, so that a module's shared fixture (a 2-rank search) runs once.
# TEST_WORKERS=0 runs the suite in this process. A test that asserts an A/B's decision must
# hold when the other worker holds a core: its arms' difference a sleep (not compute), its
# torch at one intra-op thread (the one_thread fixture).
TEST_WORKERS ?= 2
test: $(STAMP) chromium compat
	$(PY) -m pytest -q --durations=25 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# sdist, then the wheel built from it, into dist/.
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist . >$(VENV)/build.log 2>&1 || { cat $(VENV)/build.log; exit 1; }
	@ls dist

# torch==$(COMPAT_TORCH) resolves to the local CPU wheel (a +cpu local version sorts above
# the plain one); created once, then reused: the wheel is reinstalled on every run.
$(COMPAT_STAMP):
	@test -x $(COMPAT_PY) || $(PYTHON) -m venv $(COMPAT)
	$(COMPAT_PY) -m pip install $(PIP_QUIET) 'torch==$(COMPAT_TORCH)'
	@touch $(COMPAT_STAMP)

# The wheel resolved with its ranges (other packages at the lock's versions, torch and
# its CUDA companions left out so the installed torch has to satisfy the range as it is),
# then the check that torch is untouched and the compatible part of the suite.
compat: dist $(COMPAT_STAMP)
	grep -v -i -E '^((torch|torchvision|triton)==|(nvidia|cuda)-)' $(LOCK) > $(COMPAT)/constraints.txt
	$(COMPAT_PY) tests/torch_identity.py > $(COMPAT)/torch-before.json
	$(COMPAT_PY) -m pip uninstall $(PIP_QUIET) -y profilednn
	$(COMPAT_PY) -m pip install $(PIP_QUIET) -c $(COMPAT)/constraints.txt dist/profilednn-*.whl \
	    pytest pytest-timeout hypothesis
	PROFILEDNN_COMPAT_DIR=$(COMPAT) PROFILEDNN_DIST_DIR=dist \
	    $(COMPAT_PY) -m pytest -q -p no:cacheprovider $(COMPAT_TESTS)

# The oldest torch the package supports (pyproject.toml's lower bound; the device machine
# has it). No CPU build of it is on the registry this project reaches, so this takes PyPI's
# CUDA build with its CUDA libraries: about 4 GB of downloads and a 5 GB venv, kept outside
# the checkout and reused. Not part of `make test`; run it when the torch range changes.
OLDEST_TORCH  ?= 2.11.0
OLDEST_COMPAT ?= $(HOME)/.cache/profilednn/venv-compat-$(OLDEST_TORCH)
compat-oldest:
	$(MAKE) compat COMPAT=$(OLDEST_COMPAT) COMPAT_TORCH=$(OLDEST_TORCH)

# Rewrite the lock from what .venv holds now (after adding or upgrading a dependency).
lock: $(STAMP)
	{ sed -n '1,3p' $(LOCK); $(PY) -m pip freeze --exclude-editable | grep -v -E '^(#|-e )' | sort -f; } \
	    > $(LOCK).new && mv $(LOCK).new $(LOCK)

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

# Measure what this machine can answer of the project's hardware targets (any CPU; 8+ cores;
# CUDA) against a time budget; writes verify-out/verify.{json,md,log}. VERIFY_ARGS adds
# options (e.g. VERIFY_ARGS='--budget-s 900' or '--quick'). On a borrowed machine with its
# own torch, benchmarks/device_verify.sh runs the same without make or a venv.
VERIFY_ARGS ?=
verify: $(STAMP)
	$(PY) benchmarks/verify.py $(VERIFY_ARGS)

clean:
	rm -rf $(VENV) $(COMPAT) build dist src/*.egg-info .pytest_cache
