# Two entry points for a fresh Debian machine: `make demo` and `make test`.
# Both install what they need (virtual environment, Python packages, Prometheus and
# Alertmanager from Debian) and are safe to run again. `make unit` is the fast loop.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
GPUHEALTH := $(VENV)/bin/gpuhealth
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=
# Test processes: the end-to-end runs mostly wait on simulated time, so three share two cores well.
PYTEST_WORKERS ?= 3

.PHONY: setup tools demo test lint unit bench clean

setup: $(VENV)/.installed tools

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@# The package holds the product only; the test harness (simulator, demo, bench, dashboards,
	@# gpuhealth.testing) is imported from this checkout, which this puts on the venv's path.
	$(PY) -c 'import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_path("purelib"), "gpuhealth-checkout.pth").write_text(sys.argv[1] + "\n")' '$(CURDIR)'
	touch $@

# Prometheus 2.42 (with promtool) and Alertmanager 0.25 (with amtool) from Debian.
tools:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null || ! command -v amtool >/dev/null \
	    || ! command -v prometheus-alertmanager >/dev/null; then \
	  echo "installing prometheus and prometheus-alertmanager from Debian"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq prometheus prometheus-alertmanager >/dev/null; \
	fi

# The report is one self-contained HTML file: open it from a file browser.
DEMO_REPORT ?= demo-report.html

demo: setup
	$(GPUHEALTH) demo --scenario closed-loop --report $(DEMO_REPORT)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: setup lint
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# Everything that starts no real server (marker policy: tests/conftest.py), in under a minute.
# promtool and amtool run here, so it needs the tools too.
unit: setup
	$(VENV)/bin/pytest -q -m "not integration" $(PYTEST_ARGS)

bench: setup
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
