# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The optional dependencies (pyproject extras) each goal installs; append new extras here.
DEMO_EXTRAS := tensorboard
TEST_EXTRAS := dev,export,video,tensorboard,eval,openvino,serve,track,supervision,docs,tflite

.PHONY: demo test test-fast lint docs install clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# One stamp per set of extras: `make test` after `make demo` installs what the tests add.
$(VENV)/.installed-%: $(PY) pyproject.toml
	$(PY) -m pip install --upgrade pip
	# torch/torchvision first, pinned to the builds this machine serves from local disk.
	$(PY) -m pip install "torch==2.14.1" "torchvision==0.29.1"
	$(PY) -m pip install -e ".[$*]"
	touch $@

install: $(VENV)/.installed-$(TEST_EXTRAS)

demo: $(VENV)/.installed-$(DEMO_EXTRAS)
	$(VENV)/bin/ssd demo

lint: $(VENV)/.installed-$(TEST_EXTRAS)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/lint-imports

# The site (docs/ and the API reference from the docstrings) into site/; --strict: a dangling reference fails.
docs: $(VENV)/.installed-$(TEST_EXTRAS)
	$(VENV)/bin/mkdocs build --strict --site-dir site

# Everything, with the 20 slowest tests listed; `make test-fast` is the inner loop (no test marked slow).
test: lint docs
	$(PY) -m pytest -q --durations=20

test-fast: $(VENV)/.installed-$(TEST_EXTRAS)
	$(PY) -m pytest -q -m "not slow" --durations=10

clean:
	rm -rf $(VENV) runs build site *.egg-info src/*.egg-info
