#!/usr/bin/env bash
# Prepare what the lent GPU machine lacks for benchmarks/gpu_checks.sh (run this here, right before
# the device call; both folders are git-ignored and named in the call's `carry`):
#   .whl/    wheels of the packages the machine does not have (Python 3.12, torch 2.11, transformers
#            5.17, accelerate, peft are there; TRL, datasets, tensordict, omegaconf are not; Ray is not
#            needed: the GPU runs use the local backend). About 4.5 MB.
#   .bench/  tokenizer/ (the SmolLM2 tokenizer as a folder), arith/ (the main job's data),
#            COMMIT (the commit the bundle was made from). About 6 MB.
# The SmolLM2 weights do not travel (the GGUF file is 98 MB, the carried tree at most 64 MiB): the
# GPU checks use a random-init model of the same architecture, made on the machine.
# Ends by printing what the device call would carry (tracked files + untracked ones + the bundle).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
rm -rf .whl && mkdir -p .whl .bench
LIST=benchmarks/gpu_bundle_wheels.txt
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $(grep -v '^#' $LIST | grep -v ' source$')
# PyPI has only the source of these: a wheel is built here (pure Python)
$PY -m pip wheel -q --no-deps -w .whl $(grep ' source$' $LIST | cut -d' ' -f1)
$PY -c "from rlvr.utils.model import load_tokenizer; load_tokenizer('smollm2-135m-instruct').save_pretrained('.bench/tokenizer')"
test -f data/arith/test.jsonl || $PY -m rlvr.data_prep.reasoning_gym --out data/arith
rm -rf .bench/arith && cp -r data/arith .bench/arith
echo "$(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')" > .bench/COMMIT
du -sh .whl .bench
# what travels: tracked files, untracked files that are not ignored, and the carried folders
{ git ls-files -z; git ls-files -z --others --exclude-standard; } | du -cb --files0-from=- 2>/dev/null | tail -1 \
    | awk '{printf "tracked + untracked files: %.1f MiB\n", $1 / 1048576}'
du -cb .whl .bench | tail -1 | awk '{printf "carried .whl + .bench: %.1f MiB\n", $1 / 1048576}'
