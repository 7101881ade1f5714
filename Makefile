# Two entry points for a fresh Debian machine with Go 1.26: `make demo` and `make test`.
# Both install what they need (virtual environment, Python packages, the pinned upstream
# servers built once from their Go modules into ~/.cache/gpuhealth/upstream) and are safe
# to run again. `make unit` is the fast loop.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
GPUHEALTH := $(VENV)/bin/gpuhealth
UPSTREAM := $(PYTHON) tools/upstream/build.py
PYTEST_ARGS ?=
# Test processes: the end-to-end runs mostly wait on simulated time, so four share two cores
# (measured: each scenario takes as long with four processes as with three). Work stealing: an
# idle process takes tests queued for a busy one (the default hands out fixed chunks, which left
# one process running the last end-to-end scenarios one after another for a quarter of the run).
PYTEST_WORKERS ?= 4

.PHONY: setup tools demo-tools demo test lint unit bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@# The package holds the product only; the test harness (simulator, demo, bench, dashboards,
	@# gpuhealth.testing) is imported from this checkout, which this puts on the venv's path.
	$(PY) -c 'import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_path("purelib"), "gpuhealth-checkout.pth").write_text(sys.argv[1] + "\n")' '$(CURDIR)'
	touch $@

# The pinned upstream servers (tools/upstream/): built on the first run (each says how long it
# takes), then found in the cache. The demo needs only Prometheus and Alertmanager; the tests
# also run etcd, the Kubernetes control plane (1.37 and 1.36) and kube-state-metrics.
demo-tools:
	@$(UPSTREAM) demo

tools:
	@$(UPSTREAM) all

# The report is one self-contained HTML file: open it from a file browser.
DEMO_REPORT ?= demo-report.html

demo: setup demo-tools
	$(GPUHEALTH) demo --scenario closed-loop --report $(DEMO_REPORT)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: setup tools lint
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# Everything that starts no real server (marker policy: tests/conftest.py), in under a minute.
# promtool and amtool run here, so it needs the demo's tools too.
unit: setup demo-tools
	$(VENV)/bin/pytest -q -m "not integration" $(PYTEST_ARGS)

bench: setup
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
