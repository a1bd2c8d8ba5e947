#!/usr/bin/env bash
# `make gpu-check`, for a machine with an NVIDIA Hopper GPU (H100 / H200):
#   1. configure + build the CUDA backend (Release, sm_90a, all cores): test_cuda, the qmoe CLI, bench_cuda;
#   2. run test_cuda (every scheme × activation vs the CPU reference, edge cases, conformance cases);
#   3. run the GPU benchmarks through the CLI: `qmoe bench --device cuda` over the four standard shapes,
#      T = 1,16,64,256,1024,4096 and every registry scheme (plus w_mxfp4+bf16act, unquantized+bf16act):
#      whole-layer µs, GB/s, TFLOP/s, % of the performance.md §4 floor, the card's measured read
#      bandwidth, the cuBLAS bf16 grouped-GEMM anchor; CSV (bench_cuda's columns), JSON and SVG;
#   4. print a short summary table LAST.
#
# Environment:
#   CUDA_BUILD   build directory (default: build-cuda)
#   JOBS         parallel compile jobs (default: all cores)
#   BENCH_ARGS   extra arguments for `qmoe bench --device cuda`, appended (later options win), e.g.
#                "--shapes qwen3-30b-a3b --tokens 1,16" or "--schemes w_mxfp4_a_mxfp4,nvfp4"
#   SKIP_TESTS=1 / SKIP_BENCH=1 to skip a step
#   GPU_CHECK_OUT  where logs, bench_cuda.csv / .json / .svg go (default: $CUDA_BUILD/gpu-check)
#   BUILD_TARGETS  the CMake targets to build (default: "test_cuda qmoe_cli bench_cuda" and the Python
#                module where it can be built)
#   EXTRA_CUDA_FLAGS  extra nvcc flags for an experiment build (CMAKE_CUDA_FLAGS)
#   QMOE_DEPS    a prefix holding fmt / nlohmann_json / CLI11 / GTest / RE2 (usr/include, usr/lib/...),
#                for machines without those packages and without network (default: build-deps/usr
#                when it exists). Make one on a Debian/Ubuntu box with scripts/gpu_deps.sh.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${CUDA_BUILD:-$ROOT/build-cuda}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
JOBS=${JOBS:-$(nproc)}
LOGS=${GPU_CHECK_OUT:-$BUILD/gpu-check}
mkdir -p "$BUILD" "$LOGS"

echo "== gpu-check: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader || true
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvcc --version | tail -1

# ---- dependencies ---------------------------------------------------------------------------------
CMAKE_EXTRA=()
DEPS=${QMOE_DEPS:-$ROOT/build-deps/usr}
have_sys_deps() { [ -f /usr/include/fmt/core.h ] && [ -f /usr/include/nlohmann/json.hpp ] && [ -f /usr/include/CLI/CLI.hpp ] && [ -f /usr/include/gtest/gtest.h ] && [ -f /usr/include/re2/re2.h ]; }
if ! have_sys_deps; then
  if [ -d "$DEPS/include" ]; then
    echo "using build dependencies from $DEPS"
    CMAKE_EXTRA+=("-DCMAKE_PREFIX_PATH=$DEPS")
    export LD_LIBRARY_PATH="$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
    # RE2 ships only a pkg-config file: the carried pkg-config, its .pc files, paths under the prefix.
    export PATH="$DEPS/bin:$PATH"
    export PKG_CONFIG_LIBDIR="$DEPS/lib/x86_64-linux-gnu/pkgconfig:$DEPS/share/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR="$(dirname "$DEPS")"
  else
    echo "fmt / nlohmann_json / CLI11 / GTest missing: trying scripts/setup.sh (needs network)"
    bash "$ROOT/scripts/setup.sh"
  fi
fi

# ---- conformance cases ----------------------------------------------------------------------------
# test_cuda runs every non-error case; on a machine where ../shared is absent, a copy can be carried
# in build-conformance/ (cp -r ../shared/conformance/cases build-conformance).
if [ -z "${QMOE_CONFORMANCE_DIR:-}" ] && [ ! -d "$ROOT/../shared/conformance/cases" ] && [ -d "$ROOT/build-conformance" ]; then
  export QMOE_CONFORMANCE_DIR=$ROOT/build-conformance
fi
if [ -n "${QMOE_CONFORMANCE_DIR:-}" ] || [ -d "$ROOT/../shared/conformance/cases" ]; then
  echo "conformance cases: ${QMOE_CONFORMANCE_DIR:-$ROOT/../shared/conformance/cases}"
else
  echo "WARNING: no conformance cases found: test_cuda will skip them"
fi

# ---- configure + build ----------------------------------------------------------------------------
# NCCL for the multi-GPU communicators: the toolkit's, else the device image's nvidia-nccl wheel.
# NVLink multicast stays off (the GPU machines require it).
export NCCL_NVLS_ENABLE=0
if [ -z "${QMOE_NCCL_ROOT:-}" ]; then
  QMOE_NCCL_ROOT=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  export QMOE_NCCL_ROOT
fi
# The Python module too where nanobind and torch are installed (the device path of the binding:
# tests/python/test_cuda.py), unless SKIP_PYTHON=1.
PY_TARGET=()
if [ "${SKIP_PYTHON:-0}" != 1 ] && python3 -c "import nanobind, torch, pytest" 2>/dev/null; then
  CMAKE_EXTRA+=("-DQMOE_PYTHON=ON" "-DPython_EXECUTABLE=$(command -v python3)")
  PY_TARGET=(_qmoe)
fi
# CMake < 3.26 does not know the c++20 flag for nvcc; naming it is harmless on newer versions.
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DQMOE_CUDA=ON -DQMOE_CUDA_ARCHS=90a \
  -DQMOE_BUILD_TESTS=ON -DQMOE_BUILD_BENCH=ON \
  -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 \
  "-DCMAKE_CUDA_FLAGS=${EXTRA_CUDA_FLAGS:-}" "${CMAKE_EXTRA[@]}" >"$LOGS/configure.log" 2>&1 || { tail -30 "$LOGS/configure.log"; exit 1; }
grep -E "qmoe: NCCL" "$LOGS/configure.log" || true
t0=$(date +%s)
read -r -a TARGETS <<<"${BUILD_TARGETS:-test_cuda qmoe_cli bench_cuda ${PY_TARGET[*]}}"
cmake --build "$BUILD" --target "${TARGETS[@]}" -j "$JOBS" >"$LOGS/build.log" 2>&1 || {
  grep -E "error|Error" "$LOGS/build.log" | head -40
  exit 1
}
echo "build: $(( $(date +%s) - t0 )) s"
TEST_BIN=$BUILD/tests/test_cuda
CLI_BIN=$BUILD/qmoe

# ---- tests ----------------------------------------------------------------------------------------
TEST_SUMMARY="test_cuda: skipped"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  set +e
  (cd "$ROOT" && "$TEST_BIN" --gtest_brief=1 --gtest_output="xml:$LOGS/test_cuda.xml") >"$LOGS/test_cuda.log" 2>&1
  rc=$?
  set -e
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|Failure|Expected|Which is|rows over|rel" "$LOGS/test_cuda.log" | head -60 || true
  passed=$(grep -oE "\[  PASSED  \] [0-9]+" "$LOGS/test_cuda.log" | grep -oE "[0-9]+" || echo 0)
  failed=$(grep -oE "\[  FAILED  \] [0-9]+ test" "$LOGS/test_cuda.log" | grep -oE "[0-9]+" || echo 0)
  TEST_SUMMARY="test_cuda: exit $rc, ${passed:-0} passed, ${failed:-0} failed (log: $LOGS/test_cuda.log)"
fi

# ---- Python on the GPU -----------------------------------------------------------------------------
# The built module beside the package's .py files, then pytest tests/python (CPU and CUDA tests).
PY_SUMMARY="python: skipped (SKIP_PYTHON=1, or no nanobind / torch / pytest)"
if [ ${#PY_TARGET[@]} -gt 0 ] && [ "${SKIP_TESTS:-0}" != 1 ]; then
  PYDIR=$BUILD/python-pkg
  rm -rf "$PYDIR" && mkdir -p "$PYDIR/qmoe"
  cp "$ROOT"/python/qmoe/*.py "$PYDIR/qmoe/" && cp "$BUILD"/python/_qmoe*.so "$PYDIR/qmoe/"
  CASES_DIR=${QMOE_CONFORMANCE_DIR:-$ROOT/../shared/conformance/cases}
  set +e
  (cd "$ROOT" && PYTHONPATH=$PYDIR QMOE_CONFORMANCE_CASES=$CASES_DIR python3 -m pytest -q -p no:cacheprovider \
    -o addopts="" tests/python ${PYTEST_ARGS:-}) >"$LOGS/pytest.log" 2>&1
  rc=$?
  set -e
  grep -E "^(FAILED|ERROR)|passed|failed|error" "$LOGS/pytest.log" | tail -30 || true
  PY_SUMMARY="python: exit $rc, $(tail -1 "$LOGS/pytest.log") (log: $LOGS/pytest.log)"
fi

# ---- benchmarks -----------------------------------------------------------------------------------
TABLE=""
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  # shellcheck disable=SC2086
  "$CLI_BIN" bench --device cuda --shapes mixtral-8x7b,deepseek-v3,qwen3-30b-a3b,gpt-oss-120b \
    --schemes all,w_mxfp4+bf16act,unquantized+bf16act --tokens 1,16,64,256,1024,4096 \
    --csv "$LOGS/bench_cuda.csv" --json-out "$LOGS/bench_cuda.json" --plot "$LOGS/bench_cuda.svg" \
    ${BENCH_ARGS:-} >"$LOGS/bench_cuda.log" 2>&1 || {
    tail -20 "$LOGS/bench_cuda.log"
    echo "qmoe bench --device cuda failed"
  }
  TABLE=$(grep -E "^(\||device cuda:|cuBLAS anchor:)" "$LOGS/bench_cuda.log" || true)
fi

echo
echo "$TEST_SUMMARY"
echo "$PY_SUMMARY"
if [ -n "$TABLE" ]; then echo "$TABLE"; fi  # (exit 0 when the bench is skipped)
