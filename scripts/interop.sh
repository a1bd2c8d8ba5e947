#!/usr/bin/env bash
# `make interop`: qmoe against real AMD Quark exports (tests/interop). A virtual environment
# (QMOE_INTEROP_VENV, default build-interop-venv; kept between runs, since torch is large) gets
# torch (CPU wheels from download.pytorch.org where reachable, else PyPI), transformers, amd-quark
# and safetensors at the versions the test was written against (QMOE_INTEROP_PACKAGES overrides),
# then qmoe itself (`pip install .`, incremental in build-interop-py), then pytest tests/interop.
# Extra arguments go to pytest (e.g. -k nvfp4); QMOE_INTEROP_ARCHS / QMOE_INTEROP_SCHEMES narrow
# the matrix, QMOE_INTEROP_REPORT=FILE.json records every case's rel-L2 (tests/interop docstring).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(realpath -m "${QMOE_INTEROP_VENV:-build-interop-venv}")
packages=${QMOE_INTEROP_PACKAGES:-"amd-quark==0.13 transformers==5.24.0 safetensors numpy ml_dtypes pytest"}
t0=$(date +%s)
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
if ! "$py" -c 'import torch' 2>/dev/null; then
  "$py" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu 2>/dev/null \
    || "$py" -m pip install -q torch
fi
# shellcheck disable=SC2086
"$py" -m pip install -q $packages
t1=$(date +%s)
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
"$py" -m pip install -q . -Cbuild-dir=build-interop-py
t2=$(date +%s)
"$py" -c 'import torch, transformers, quark, qmoe; print("torch", torch.__version__, "| transformers", transformers.__version__, "| amd-quark", quark.__version__, "| qmoe", qmoe.__version__)'
# From outside the source tree, so `import qmoe` is the installed wheel, not python/qmoe.
(cd tests/interop && "$py" -m pytest -q -p no:cacheprovider "$@" .)
t3=$(date +%s)
echo "interop: packages $((t1 - t0))s, pip install . $((t2 - t1))s, pytest $((t3 - t2))s"
