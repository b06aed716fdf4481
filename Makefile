# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv and install the package
# (which compiles the C++ kernel) when the sources of the install changed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): setup.py pyproject.toml $(wildcard ms_swiglu/csrc/*) $(wildcard ms_swiglu/backends/cpu/csrc/*) $(wildcard tools/csrc/*)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

demo: $(STAMP)
	$(PY) -m ms_swiglu.demo

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile tests

bench: $(STAMP)
	$(PY) -m ms_swiglu.tools.bench_swiglu

clean:
	rm -rf $(VENV) build *.egg-info ms_swiglu/backends/cpu/_kernels*.so ms_swiglu/_sigorigin*.so ms_swiglu/tools/_probes*.so tools/_probes*.so
