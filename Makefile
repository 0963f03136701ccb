# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The optional dependencies (pyproject extras) each goal installs; append new extras here.
DEMO_EXTRAS := tensorboard
# The one OpenCV distribution the environment keeps, and those the extras pull in that it replaces.
CV2 := opencv-contrib-python-headless>=4.9
CV2_DISTRIBUTIONS := opencv-python opencv-python-headless opencv-contrib-python opencv-contrib-python-headless
TEST_EXTRAS := dev,export,video,tensorboard,eval,openvino,serve,track,supervision,docs,ncnn,tune,mlflow,tflite

.PHONY: demo test test-fast lint docs install clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# One stamp per set of extras: `make test` after `make demo` installs what the tests add.
$(VENV)/.installed-%: $(PY) pyproject.toml
	$(PY) -m pip install --upgrade pip
	# torch/torchvision first, pinned to the builds this machine serves from local disk.
	$(PY) -m pip install "torch==2.14.1" "torchvision==0.29.1"
	$(PY) -m pip install -e ".[$*]"
	# One cv2: [video] brings opencv-python-headless, supervision opencv-python, mediapipe opencv-contrib-python, and
	# each writes the same cv2 folder (uninstalling one deletes the others' files): all go, one superset comes back
	# (contrib modules, no GUI; tests/test_packaging.py checks that one is left).
	$(PY) -m pip uninstall -y $(CV2_DISTRIBUTIONS)
	$(PY) -m pip install "$(CV2)"
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

# Everything, with the 20 slowest tests listed, on two worker processes (a test file stays on one: its fixtures are
# built once); `make test-fast` is the inner loop (no test marked slow).
test: lint docs
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=20

test-fast: $(VENV)/.installed-$(TEST_EXTRAS)
	$(PY) -m pytest -q -m "not slow" --durations=10

clean:
	rm -rf $(VENV) runs build site *.egg-info src/*.egg-info
