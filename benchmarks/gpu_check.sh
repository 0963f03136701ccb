#!/usr/bin/env bash
# The checks of a day a CUDA GPU is lent (issue 18), at most about 8 minutes. Each step runs under its own time
# limit; its result (ok / FAILED rc / skipped: why) is collected and one summary table is printed at the end, also
# when a step fails. Exit status: 1 when any step failed, else 0 (skips included).
#
# Run from the repository root: bash benchmarks/gpu_check.sh   (PYTHON=/path/to/python to choose the interpreter;
# SSD_SHARED_DATA as everywhere). Logs go to $GPU_CHECK_OUT (default benchmarks/results/gpu_check/).
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[[ -x $PYTHON ]] || PYTHON=python
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
export SSD_SHARED_DATA=${SSD_SHARED_DATA:-$(cd .. && pwd)/shared/data}
OUT=${GPU_CHECK_OUT:-benchmarks/results/gpu_check}
mkdir -p "$OUT"
declare -a NAMES=() RESULTS=()

record() { NAMES+=("$1"); RESULTS+=("$2"); }

# step NAME SECONDS CMD...: run CMD with a time limit, its output in $OUT/NAME.log
step() {
    local name=$1 limit=$2 rc=0
    shift 2
    echo "=== $name: $*"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
    tail -n 15 "$OUT/$name.log"
    if [[ $rc -eq 0 ]]; then
        record "$name" "ok"
    elif [[ $rc -eq 124 ]]; then
        record "$name" "FAILED: over ${limit}s"
    else
        record "$name" "FAILED: exit $rc"
    fi
}

skip() { echo "=== $1: skipped ($2)"; record "$1" "skipped: $2"; }

GPUS=0
if command -v nvidia-smi >/dev/null 2>&1; then
    GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
CUDA=$("$PYTHON" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)

if [[ $CUDA != 1 ]]; then
    for name in cuda-tests label-error train-ssdlite train-ssd300 ddp-smoke; do
        skip "$name" "torch sees no CUDA device (nvidia-smi lists $GPUS)"
    done
else
    nvidia-smi -L || true
    # the CUDA tests are the ones named for it (skipped without a device; the suite marks them with skipif)
    step cuda-tests 150 "$PYTHON" -m pytest -q -p no:cacheprovider -k cuda tests
    # an out-of-range label on CUDA: our ValueError, never a device-side assert (the next CUDA call still works)
    step label-error 60 "$PYTHON" - <<'EOF'
import torch
from ssd.loss import MultiBoxLoss
from ssd.priors import default_boxes
priors = default_boxes(64, [8], [8], [16], [32], [[2]]).cuda()
P = priors.shape[0]
boxes = torch.tensor([[[0.1, 0.1, 0.5, 0.5]]], device="cuda")
labels = torch.tensor([[3]], device="cuda")  # K = 3: labels must be 0..2
try:
    MultiBoxLoss()(torch.zeros(1, P, 4, device="cuda"), torch.zeros(1, P, 4, device="cuda"), priors, boxes, labels)
except ValueError as e:
    assert "label 3 in image 0, object 0 is out of range for num_classes=3" in str(e), e
    print("refused:", e)
else:
    raise SystemExit("an out-of-range label was not refused")
torch.cuda.synchronize()
print("CUDA still usable:", float(torch.ones(1, device="cuda").sum()))
EOF
    if [[ -e $SSD_SHARED_DATA/aquarium/data.yaml ]]; then
        step train-ssdlite 120 "$PYTHON" benchmarks/train.py --device cuda --amp --model ssdlite320_mobilenet_v3_large \
            --batch-size 32 --workers 4 --iters 20 --warmup 5
        step train-ssd300 150 "$PYTHON" benchmarks/train.py --device cuda --amp --model ssd300_vgg16 \
            --batch-size 32 --workers 4 --iters 20 --warmup 5
    else
        skip train-ssdlite "no $SSD_SHARED_DATA/aquarium"
        skip train-ssd300 "no $SSD_SHARED_DATA/aquarium"
    fi
    if [[ $GPUS -ge 2 ]]; then
        DEMO=$OUT/ddp-data
        step ddp-smoke 120 bash -c "'$PYTHON' -c 'from ssd.data.synthetic import generate_synthetic as g; \
g(\"$DEMO\", num_train=64, num_val=16, image_size=128)' && '$PYTHON' -m torch.distributed.run --standalone \
--nproc_per_node 2 -m ssd train --data '$DEMO' --model ssd_tiny --image-size 128 --epochs 2 --batch-size 8 \
--workers 0 --device cuda --quiet --project '$OUT/ddp-runs' --exist-ok"
    else
        skip ddp-smoke "nvidia-smi lists $GPUS GPU(s), 2 needed"
    fi
fi

echo
echo "| step | result |"
echo "|---|---|"
FAILED=0
for i in "${!NAMES[@]}"; do
    echo "| ${NAMES[$i]} | ${RESULTS[$i]} |"
    if [[ ${RESULTS[$i]} == FAILED* ]]; then FAILED=1; fi
done
echo "logs: $OUT"
exit $FAILED
