# Setup is two commands: `make demo` and `make test`. Each builds .venv with pinned deps.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-v2

.PHONY: demo test test-all test-defer bench venv clean

# setup.py and csrc/: `pip install -e .` compiles the five C++ extensions (device generator, pinned factories, device guard, call keys, cache hits)
$(STAMP): pyproject.toml setup.py $(wildcard csrc/*.cpp csrc/*.h)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch==2.13.0 resolves to the CPU wheel on this machine's disk; never a CUDA build.
	$(BIN)/pip install -q torch==2.13.0 jax==0.10.2 jaxlib==0.10.2 numpy pytest pytest-xdist expecttest safetensors matplotlib transformers==5.24.0 accelerate==1.15.0 diffusers==0.42.1 parameterized==0.9.0 pytest-timeout==2.4.0 helion==1.5.1 tokamax==0.0.12 \
		torchtitan==0.3.0 trl==1.16.0 peft==0.21.2 datasets==4.7.0 fastapi==0.165.0 uvicorn==0.55.0 openai==3.57.0 typeguard==2.13.3 torchao==0.18.0
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m torchtpu.demo

CORE_TESTS := tests/test_device.py tests/test_views.py tests/test_training.py tests/test_eager_modes.py

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m "not slow"
	# the core tests again with every op deferred and fused
	TORCHTPU_EAGER_MODE=defer_and_fuse $(BIN)/python -m pytest -n 2 -q -m "not slow" $(CORE_TESTS)

test-all: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q

# the whole fast suite with defer_and_fuse as the default mode (issue 14's "both modes"; ~2x make test)
test-defer: $(STAMP)
	TORCHTPU_EAGER_MODE=defer_and_fuse $(BIN)/python -m pytest -n 2 -q -m "not slow" --durations=30

bench: $(STAMP)
	$(BIN)/python -m torchtpu.bench eager

clean:
	rm -rf $(VENV) *.egg-info torchtpu/runtime/_generator*.so torchtpu/device/_pinned_factories*.so torchtpu/runtime/_device_guard*.so torchtpu/runtime/_scan*.so
