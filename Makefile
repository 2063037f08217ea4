# The two commands: `make demo` and `make test`. Both create .venv when missing and install hookscope
# with the pinned torch/torchvision (constraints.txt); the install reruns only when pyproject changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --disable-pip-version-check -q -c constraints.txt

.PHONY: demo test lint bench clean browser

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q --upgrade pip

$(VENV)/.installed: pyproject.toml constraints.txt | $(PY)
	$(PIP) -e ".[vision]"
	touch $@

$(VENV)/.installed-dev: pyproject.toml constraints.txt | $(PY)
	$(PIP) -e ".[vision,dev,integrations,trackers,pruning,bench]"
	touch $@ $(VENV)/.installed

# `hookscope train` with its defaults: digits, a small CNN, the doctor and statistics; ends by printing the
# path of runs/demo/report.html and the top findings (--overwrite: each demo replaces the last one).
demo: $(VENV)/.installed
	$(VENV)/bin/hookscope train --out runs/demo --overwrite

# The report test opens report.html in headless Chromium; install Debian's package when it is missing
# (as root, like CI). When that is impossible the browser test is skipped and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) \
		|| echo "warning: chromium could not be installed; tests/viz/test_report.py will be skipped" >&2

# The suite in two parts: all but the `serial` tests on two workers (pytest-xdist; a file stays on one
# worker, so its module fixtures are built once), then the `serial` ones alone, since they measure time or
# start several ranks. Both parts always run; make fails with the first failing part's status.
test: $(VENV)/.installed-dev browser
	$(PY) -m pytest -n 2 --dist loadfile -m "not serial"; first=$$?; \
	$(PY) -m pytest -m serial; second=$$?; \
	[ $$first -ne 0 ] && exit $$first; exit $$second

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
