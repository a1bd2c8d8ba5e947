#!/usr/bin/env bash
# The Python face in a fresh virtual environment: `pip install .` (the wheel builds the C++
# library, CPU only, Release, the module and its stubs only), then pytest tests/python.
# QMOE_PY_VENV (default build-pyvenv) is the venv; QMOE_CLI, when it names a built qmoe binary,
# lets the tests compare ckpt.inspect() with `qmoe inspect --json`. torch is not installed here
# (PyPI's wheel pulls gigabytes of CUDA libraries): the torch tests skip unless it is present.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(realpath -m "${QMOE_PY_VENV:-build-pyvenv}")
rm -rf "$venv"
if ! python3 -m venv "$venv"; then  # a Debian python3 without venv / headers
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv python3-dev >/dev/null
  rm -rf "$venv" && python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q numpy ml_dtypes pytest
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
t0=$(date +%s)
"$venv/bin/python" -m pip install -q .
echo "pip install .: $(( $(date +%s) - t0 ))s"
"$venv/bin/python" -c 'import qmoe; print("qmoe", qmoe.__version__, "cuda" if qmoe.has_cuda else "cpu", len(qmoe.schemes()), "schemes")'
if [ -z "${QMOE_CLI:-}" ] && [ -x build/qmoe ]; then export QMOE_CLI=$PWD/build/qmoe; fi
# From outside the source tree, so `import qmoe` is the installed wheel, not python/qmoe.
(cd tests/python && "$venv/bin/python" -m pytest -q -p no:cacheprovider .)

# The binding against the CUDA backend, compiled and linked only (no GPU in CI): reuses the
# CUDA step's build-cuda (.ci/run), where the libraries are already built.
if [ -x /usr/local/cuda/bin/nvcc ] && [ -f build-cuda/CMakeCache.txt ]; then
  "$venv/bin/python" -m pip install -q nanobind
  cmake -S . -B build-cuda -DQMOE_PYTHON=ON -DPython_EXECUTABLE="$venv/bin/python" >/dev/null
  cmake --build build-cuda --target _qmoe _qmoe_stub
  "$venv/bin/python" -c 'import sys; sys.path.insert(0, "build-cuda/python"); import _qmoe
assert _qmoe.has_cuda, "build-cuda/python/_qmoe was built without CUDA"
print("CUDA binding built; a CUDA device is", "visible" if _qmoe.cuda_available() else "not visible")'
fi
