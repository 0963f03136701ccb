# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --upgrade pip
	# torch/torchvision first, pinned to the builds this machine serves from local disk.
	$(PY) -m pip install "torch==2.14.1" "torchvision==0.29.1"
	$(PY) -m pip install -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ssd demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

test: lint
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs build *.egg-info src/*.egg-info
