#!/usr/bin/env bash
# What the lent GPU machine (Python 3.12, torch, transformers, peft, accelerate; no network) lacks for
# `python -m benchmarks.bench_grpo_vs_trl --size smollm2-135m`: wheels of the packages below in
# .whl/ and the SmolLM2 tokenizer as a folder in .bench/tokenizer (the 98 MB GGUF cannot travel).
# Both folders must be git-ignored (`echo /.whl/ >> .git/info/exclude`, same for /.bench/) and
# named in the device run's `carry`. On the device:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#   python3 -m benchmarks.bench_grpo_vs_trl --size smollm2-135m --tokenizer .bench/tokenizer --steps 5 --warmup 2
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 omegaconf==2.4.0 \
    antlr4-python3-runtime==4.13.2 tensordict==0.15.3 pyvers==0.2.3
.venv/bin/python -c "from rlvr.utils.model import load_tokenizer; load_tokenizer('smollm2-135m-instruct').save_pretrained('.bench/tokenizer')"
du -sh .whl .bench
