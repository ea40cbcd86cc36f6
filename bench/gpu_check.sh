#!/usr/bin/env bash
# Everything a GPU machine should check, in one go, ending with one table:
#   1. the GPU tests: python -m pytest -m gpu -q tests/test_gpu.py (with the project's addopts,
#      themselves -q, cleared, so that the log ends with the counts)
#   2. copies: plain pinned cudaMemcpyAsync host->GPU, GPU->host and both at once (256 MiB),
#      against the executor's own loads and offloads of the same bytes (goal: >= 90%)
#   3. dispatch overhead: makespan / vertices of a chain of 20,000 one-element adds on one GPU
#   4. offloadlab calibrate --backend cupy (from p100x4 with as many GPUs as the workloads use),
#      then offloadlab validate (simulated against measured makespan) of matmul-chain and of a
#      random DAG (sizes rounded to whole float32 elements: see tests/test_gpu.py) on it
# Results, logs and the table go to ${OUT:-gpu-check-out}.  Run from anywhere:
#   bash bench/gpu_check.sh
set -euo pipefail

OUT="${OUT:-gpu-check-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROWS="$OUT/results.tsv"
: > "$ROWS"
export MPLBACKEND=Agg

COUNT='import cupy; print(cupy.cuda.runtime.getDeviceCount())'
if ! GPUS="$(python -c "$COUNT" 2>"$OUT/cupy.log")" || [ "${GPUS:-0}" -lt 1 ]; then
    echo "gpu_check: no GPU visible to CuPy (pip install 'offloadlab[gpu]' on a machine with an" \
         "NVIDIA GPU); see $OUT/cupy.log" >&2
    exit 1
fi
# the workloads and the calibrated machine use 1 or 2 GPUs (matmul-chain: hidden % gpus == 0)
G=$(( GPUS >= 2 ? 2 : 1 ))
echo "gpu_check: $GPUS GPU(s) visible; results in $OUT"

row() { printf '%s\t%s\n' "$1" "$2" >> "$ROWS"; }

# step NAME LOG COMMAND...: run COMMAND, its output to LOG; a failure becomes a row of the
# table (with the log's last line) and the next step runs
step() {
    local name="$1" log="$2" rc=0
    shift 2
    echo "gpu_check: $name ..."
    "$@" > "$log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        row "$name" "FAILED (exit $rc): $(tail -n 1 "$log"); see $log"
    fi
    return "$rc"
}

# validate LABEL SOURCE-OPTION SOURCE: simulated against measured, on the calibrated machine
validate() {
    local json="$OUT/validate-$1.json" log="$OUT/validate-$1.log" rc=0
    echo "gpu_check: validate $1 ..."
    python -m offloadlab validate "$2" "$3" --machine "$OUT/machine.json" \
        --planner buildmemgraph --planner levelwise --backend cupy --json \
        > "$json" 2> "$log" || rc=$?
    if [ -s "$json" ]; then       # written even when the outputs are wrong (exit 1)
        python bench/gpu_check.py validated --json "$json" --label "$1" --rows "$ROWS" \
            || row "validate $1" "could not read the rows of $json"
    fi
    if [ "$rc" -ne 0 ]; then
        row "validate $1" "FAILED (exit $rc): $(tail -n 1 "$log"); see $log"
    fi
}

if step "pytest -m gpu tests/test_gpu.py" "$OUT/pytest.log" \
        python -m pytest -o addopts= -m gpu -q tests/test_gpu.py; then
    row "pytest -m gpu tests/test_gpu.py" "$(tail -n 1 "$OUT/pytest.log")"
fi
step "copies" "$OUT/copies.log" python bench/gpu_check.py copies --rows "$ROWS" || true
step "dispatch" "$OUT/dispatch.log" python bench/gpu_check.py dispatch --rows "$ROWS" || true
if step "calibrate --backend cupy" "$OUT/calibrate.log" \
        python -m offloadlab calibrate --backend cupy --machine "p100x4:gpus=$G" \
        --out "$OUT/machine.json"; then
    row "calibrate --backend cupy" "wrote $OUT/machine.json"
    validate matmul-chain --workload "matmul-chain:gpus=$G"
    if step "random DAG TaskGraph" "$OUT/random-dag.log" python bench/gpu_check.py taskgraph \
            --workload "random:vertices=200,gpus=$G,seed=1" --out "$OUT/random-dag.json"; then
        validate random-dag --taskgraph "$OUT/random-dag.json"
    fi
fi

echo
python bench/gpu_check.py table --rows "$ROWS" | tee "$OUT/table.txt"
