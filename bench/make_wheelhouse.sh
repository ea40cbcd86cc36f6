#!/usr/bin/env bash
# Fill the git-ignored wheelhouse/ with a wheel of every runtime dependency of offloadlab that
# a bare GPU machine lacks, for x86-64 Linux and CPython 3.12 (that machine's Python), so that
# bench/gpu_check.sh can install them there with no network:
#   bash bench/make_wheelhouse.sh            # then carry wheelhouse/ with the check
# The GPU machines' image already holds CuPy, pytest, hypothesis, NumPy, pandas, pyarrow,
# matplotlib, networkx, tqdm and threadpoolctl (docs/gpu.md); SKIP names those, and every
# other requirement in pyproject.toml's [project] dependencies is downloaded, with the
# version range written there.  gpu_check.sh installs only what is really missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
DEST="${WHEELHOUSE:-wheelhouse}"
SKIP="${SKIP:-numpy pandas pyarrow matplotlib networkx tqdm threadpoolctl}"
PYVER="${WHEEL_PYTHON:-3.12}"

mapfile -t REQS < <("$PY" - "$SKIP" <<'PYEOF'
import re, sys, tomllib
skip = set(sys.argv[1].split())
for req in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()
    if name not in skip:
        print(req)
PYEOF
)
rm -rf "$DEST"
mkdir -p "$DEST"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DEST" "${REQS[@]}"
echo "make_wheelhouse: ${#REQS[@]} requirement(s) in $DEST ($(du -sh "$DEST" | cut -f1)):"
ls "$DEST"
