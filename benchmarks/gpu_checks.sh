#!/usr/bin/env bash
# The GPU checks in one device call (benchmarks/gpu_check_steps.py says what each step does, in
# issue #47's order). Before the call, here: bash benchmarks/prepare_gpu_bundle.sh (fills .whl/ and
# .bench/). The calls (docs/PERFORMANCE.md, "GPU checks"): run(command="bash benchmarks/gpu_checks.sh
# --budget-s 480", carry=[".whl", ".bench"], timeout_s=540), then the skipped steps by name.
# Results land in $OUT as each step ends: results.jsonl, steps.log, summary.md, install.log.
#   bash benchmarks/gpu_checks.sh                 # on the GPU machine ($OUT set there)
#   bash benchmarks/gpu_checks.sh cpu             # rehearsal here: tiny models, .venv, GPU imports blocked
# Further arguments go to the driver (e.g. --steps make_model,async,gpu_tests --budget-s 240).
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda
if [ "${1:-}" = cpu ] || [ "${1:-}" = cuda ]; then DEVICE=$1; shift; fi
OUT=${OUT:-runs/gpu_checks_$DEVICE}
mkdir -p "$OUT"
# no network on the GPU machine: never wait for the model hub
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1
if [ "$DEVICE" = cuda ]; then
    PY=${PY:-python3}
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv > "$OUT/install.log" 2>&1
    # the carried wheels, as the device README says (no index, no dependencies: the machine has the rest)
    if ! $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl >> "$OUT/install.log" 2>&1; then
        echo "installing the carried wheels failed:"; cat "$OUT/install.log"; exit 1
    fi
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
    PY=${PY:-.venv/bin/python}
fi
$PY -m benchmarks.gpu_checks --device "$DEVICE" --out "$OUT" "$@"
status=$?
cat "$OUT/summary.md" 2>/dev/null
exit $status
