# The README's two commands: `make demo` and `make test`. Each builds .venv from
# nothing when it is missing or stale, then runs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
CONSTRAINTS := -c constraints.txt

# Plugins installed with their dependencies, and those installed with --no-deps:
# vllm gets its own venv (make test-vllm) and torch_npu breaks `import torch`
# on a machine without Ascend hardware.
PLUGINS := grpo gae ppo dpo qwen3
NODEPS_PLUGINS := vllm npu
CONTRIB := $(wildcard contrib/*/pyproject.toml)

STAMP := $(VENV)/.astrai-installed
SOURCES := pyproject.toml constraints.txt Makefile $(wildcard plugins/*/pyproject.toml) $(CONTRIB)

.PHONY: demo test venv clean bench

venv: $(STAMP)

$(STAMP): $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(CONSTRAINTS) "setuptools>=64" wheel
	$(PIP) install $(CONSTRAINTS) torch==2.13.0
	$(PIP) install $(CONSTRAINTS) --no-build-isolation -e ".[test]" \
		$(foreach p,$(PLUGINS),-e plugins/astrai-plugin-$(p)) \
		$(foreach c,$(CONTRIB),-e $(dir $(c)))
	$(PIP) install --no-deps --no-build-isolation \
		$(foreach p,$(NODEPS_PLUGINS),-e plugins/astrai-plugin-$(p))
	touch $@

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/astrai list-plugins
	$(PY) examples/arith/demo.py

clean:
	rm -rf $(VENV) .pytest_cache
