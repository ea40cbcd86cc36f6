#!/usr/bin/env bash
# Everything a GPU machine should check, in one go, from a bare machine that holds only this
# repository and the wheel folder bench/make_wheelhouse.sh fills (no network):
#
#   bash bench/gpu_check.sh                   # the cupy backend, on the visible GPUs
#   bash bench/gpu_check.sh --backend numpy   # the same steps on the CPU (CI runs this)
#
# Steps, each under its own timeout (a step that fails or times out becomes a row of the
# report, and the next step runs):
#   0. set-up: the project's dependencies that this Python lacks, installed from the wheel
#      folder ($WHEELHOUSE, default wheelhouse/) into a private folder, offline
#   1. the device: CuPy's version, each GPU's name, memory and what a process can allocate
#   2. the tests: pytest -m gpu tests/test_gpu.py (numpy: tests/test_kernel_cases.py)
#   3. calibrate --backend B
#   4. validate, on the calibrated machine, a random DAG and a training chain with
#      buildmemgraph and levelwise at a GPU memory where both planners offload (asserted)
#   5. copies: the executor's loads and offloads against plain pinned copies (goal >= 90%)
#   6. dispatch: makespan / vertices of a chain of one-element adds
# Results: $OUT (default gpu-check-out) holds report.json (every row, with its numbers; rows.jsonl
# as the rows come, should the check be cut short), table.txt, machine.json and calibration.csv
# (every measurement), the two validation plots, validate-plans.tar.gz (each validated plan and
# its simulated and measured traces) and log.txt (every step's output): eight files, as the
# device tool brings back no more.  The table is printed last.  On the device tool's machines the whole check takes under 8 minutes.
set -uo pipefail

BACKEND=cupy
while [ $# -gt 0 ]; do
    case "$1" in
        --backend) BACKEND="${2:-}"; shift 2 ;;
        --backend=*) BACKEND="${1#--backend=}"; shift ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (use --backend cupy|numpy)" >&2; exit 2 ;;
    esac
done
case "$BACKEND" in cupy|numpy) ;; *)
    echo "gpu_check: --backend must be cupy or numpy, got '$BACKEND'" >&2; exit 2 ;;
esac

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT="$(pwd)"
PY="${PYTHON:-python3}"
OUT="${OUT:-gpu-check-out}"
mkdir -p "$OUT" || exit 2
OUT="$(cd "$OUT" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
ROWS="$OUT/rows.jsonl"
LOG="$OUT/log.txt"
: > "$ROWS"
: > "$LOG"
export MPLBACKEND=Agg PYTHONUNBUFFERED=1
START=$SECONDS

say() { echo "gpu_check [$((SECONDS - START)) s]: $*"; }

# step NAME SECONDS COMMAND...: run COMMAND under a timeout, its output appended to the log;
# a failure becomes a row of the report
step() {
    local name="$1" limit="$2" rc=0
    shift 2
    say "$name ..."
    { echo; echo "=== $name: $*"; } >> "$LOG"
    timeout --kill-after=10 "$limit" "$@" >> "$LOG" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        local why="exit $rc"
        [ "$rc" -eq 124 ] && why="timed out after $limit s"
        "$PY" bench/gpu_check.py row --rows "$ROWS" --check "$name" --failed \
            --result "FAILED ($why): $(grep -v '^\s*$' "$LOG" | tail -n 1 | cut -c1-300)"
    fi
    return "$rc"
}

# 0. set-up: install what is missing, offline, into a private folder
SITE="$WORK/site"
MISSING="$("$PY" - <<'PYEOF'
import importlib.metadata as md, re, tomllib
for req in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    name = re.match(r"[A-Za-z0-9_.-]+", req).group(0)
    try:
        md.version(name)
    except md.PackageNotFoundError:
        print(name)
PYEOF
)" || { echo "gpu_check: $PY cannot run (set PYTHON to a Python 3.11+)" >&2; exit 2; }
if [ -n "$MISSING" ]; then
    WHEELHOUSE="${WHEELHOUSE:-$ROOT/wheelhouse}"
    say "installing $(echo $MISSING) from $WHEELHOUSE (offline) ..."
    # shellcheck disable=SC2086
    if ! "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
            --find-links "$WHEELHOUSE" --target "$SITE" $MISSING >> "$LOG" 2>&1; then
        echo "gpu_check: cannot install $(echo $MISSING) from $WHEELHOUSE (make it here with" \
             "bash bench/make_wheelhouse.sh and carry it); see $LOG" >&2
        exit 2
    fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}${MISSING:+:$SITE}"

# 1. the device
if ! step "device" 120 "$PY" bench/gpu_check.py device --backend "$BACKEND" --rows "$ROWS"; then
    [ "$BACKEND" = cupy ] && { echo "gpu_check: no GPU visible to CuPy; see $LOG" >&2; exit 1; }
fi
G=1

# 2. the tests
if [ "$BACKEND" = cupy ]; then
    TESTS=(-m gpu tests/test_gpu.py)
else
    TESTS=(tests/test_kernel_cases.py)
fi
if step "pytest ${TESTS[*]}" 180 "$PY" -m pytest -o addopts= -q -p no:cacheprovider "${TESTS[@]}"
then
    "$PY" bench/gpu_check.py row --rows "$ROWS" --check "pytest ${TESTS[*]}" \
        --result "$(grep -E '(passed|failed|skipped|error)' "$LOG" | tail -n 1)"
fi

# 3-4. calibrate, then validate two workloads where both planners offload
if [ "$BACKEND" = cupy ]; then
    WORKLOADS=("random-dag random:vertices=200,gpus=$G,seed=1"
               "training-chain training-chain:w=256MB;256MB;256MB;256MB,a=64MB;64MB;64MB;64MB,a0=64MB")
    QUICK=()
    # calibrate from the preset of the card there is (its memory and links), h100-sxm if none
    BASE="$("$PY" -c "import cupy; n = str(cupy.cuda.runtime.getDeviceProperties(0)['name'])
print('h200' if 'H200' in n else 'h100-sxm')" 2>/dev/null || echo h100-sxm)"
else
    BASE=h100-sxm
    WORKLOADS=("random-dag random:vertices=60,gpus=$G,seed=1,min_bytes=65536,max_bytes=524288"
               "training-chain training-chain:w=2MB;2MB;2MB;2MB,a=512KB;512KB;512KB;512KB,a0=512KB")
    QUICK=(--quick)
fi
if step "calibrate --backend $BACKEND" 150 "$PY" -m offloadlab calibrate --backend "$BACKEND" \
        "${QUICK[@]}" --machine "$BASE:gpus=$G" --out "$OUT/machine.json" \
        --table "$OUT/calibration.csv"; then
    "$PY" bench/gpu_check.py row --rows "$ROWS" --check "calibrate --backend $BACKEND" \
        --result "$(grep -E '^  matmul' "$LOG" | tail -n 1 | sed 's/^ *//')" \
        --data "$OUT/machine.json"
    for entry in "${WORKLOADS[@]}"; do
        label="${entry%% *}" spec="${entry#* }"
        step "validate $label" 150 "$PY" bench/gpu_check.py validate --backend "$BACKEND" \
            --workload "$spec" --machine "$OUT/machine.json" --label "$label" \
            --plot "$OUT/validate-$label.png" --rows "$ROWS"
    done
fi

# 5-6. copies and dispatch
step "copies" 60 "$PY" bench/gpu_check.py copies --backend "$BACKEND" --rows "$ROWS"
step "dispatch" 60 "$PY" bench/gpu_check.py dispatch --backend "$BACKEND" --rows "$ROWS"

"$PY" bench/gpu_check.py report --rows "$ROWS" --backend "$BACKEND" \
    --seconds "$((SECONDS - START))" --json "$OUT/report.json" | tee "$OUT/table.txt"
status=$?
# Few files, for a device tool that brings back a handful: the plans and traces in one
# archive, and rows.jsonl dropped once report.json holds its rows.
shopt -s nullglob
plans=("$OUT"/validate-*.json "$OUT"/validate-*.parquet "$OUT"/validate-*-traces.csv)
if [ ${#plans[@]} -gt 0 ] && tar -czf "$OUT/validate-plans.tar.gz" -C "$OUT" \
        "${plans[@]##*/}"; then
    rm -f "${plans[@]}"
fi
[ -s "$OUT/report.json" ] && rm -f "$ROWS"
exit "$status"
