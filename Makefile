# The two commands: `make demo` and `make test`. Both create .venv when missing and install hookscope
# with the pinned torch/torchvision (constraints.txt); the install reruns only when pyproject changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --disable-pip-version-check -q -c constraints.txt

.PHONY: demo test lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q --upgrade pip

$(VENV)/.installed: pyproject.toml constraints.txt | $(PY)
	$(PIP) -e ".[vision]"
	touch $@

$(VENV)/.installed-dev: pyproject.toml constraints.txt | $(PY)
	$(PIP) -e ".[vision,dev]"
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) examples/feature_maps.py --out runs/demo

test: $(VENV)/.installed-dev
	$(PY) -m pytest

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
