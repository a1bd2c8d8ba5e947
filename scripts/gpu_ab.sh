#!/usr/bin/env bash
# Interleaved A/B of a CUDA change on one GPU, in one call: the working tree ("new") against the
# working tree with a patch reverse-applied ("base"), both built here (qmoe_cli, in parallel), then
# `qmoe bench --device cuda` over the same points, base / new alternately for ROUNDS rounds; prints
# per point the best of the rounds' medians for each side and base / new (> 1: new is faster).
#
# Usage: scripts/gpu_ab.sh PATCH [qmoe bench arguments...]
#        scripts/gpu_ab.sh env:NAME=VALUE[,NAME=VALUE...] [qmoe bench arguments...]
#   PATCH  a diff whose reverse gives the base, e.g. `git diff HEAD~1 -- src tests > ab.patch`.
#          It travels with the tree only if git does not ignore it: the script refuses a patch that
#          does not reverse-apply cleanly, rather than compare the new tree with itself.
#   env:…  one build only: the base is the same binary run with those environment variables
#          (a runtime switch such as QMOE_CUDA_PDL=0), which halves the build time on the device.
#   default bench arguments: --shapes mixtral-8x7b,qwen3-30b-a3b --schemes w_mxfp4_a_mxfp4
#                            --tokens 1,16,64,256,4096 --reps 5 --no-anchor
# Environment: ROUNDS (default 2), AB_OUT (logs and CSVs, default build-ab/), JOBS, QMOE_DEPS.
# Both trees build in their own build-cuda/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PATCH=${1:?usage: scripts/gpu_ab.sh PATCH|env:NAME=VALUE,... [qmoe bench arguments...]}
shift
BASE_ENV=()
if [[ "$PATCH" == env:* ]]; then
  IFS=, read -r -a BASE_ENV <<<"${PATCH#env:}"
  for kv in "${BASE_ENV[@]}"; do
    [[ "$kv" =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]] || { echo "gpu_ab: '$kv' is not NAME=VALUE"; exit 1; }
  done
  [ ${#BASE_ENV[@]} -gt 0 ] || { echo "gpu_ab: env: needs at least one NAME=VALUE"; exit 1; }
  PATCH=
else
  case "$PATCH" in /*) ;; *) PATCH=$PWD/$PATCH ;; esac
  [ -f "$PATCH" ] || { echo "gpu_ab: no patch file $PATCH (an ignored file does not travel to the device)"; exit 1; }
fi
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(--shapes mixtral-8x7b,qwen3-30b-a3b --schemes w_mxfp4_a_mxfp4 --tokens 1,16,64,256,4096
                               --reps 5 --no-anchor)
ROUNDS=${ROUNDS:-2}
OUTDIR=${AB_OUT:-$ROOT/build-ab}
BASE=$(mktemp -d /tmp/qmoe-ab-base.XXXXXX)
trap 'rm -rf "$BASE"' EXIT
mkdir -p "$OUTDIR"

export SKIP_TESTS=1 SKIP_BENCH=1 SKIP_PYTHON=1 BUILD_TARGETS=qmoe_cli CUDA_BUILD=build-cuda
if [ -n "$PATCH" ]; then
  # The base tree: a copy without build outputs, the patch reverse-applied (checked first).
  tar -C "$ROOT" --exclude='./build*' --exclude='./.git' -cf - . | tar -C "$BASE" -xf -
  for d in build-deps build-conformance; do if [ -d "$ROOT/$d" ]; then cp -r "$ROOT/$d" "$BASE/"; fi; done
  (cd "$BASE" && patch --dry-run -s -R -p1 <"$PATCH" >/dev/null) || { echo "gpu_ab: $PATCH does not reverse-apply to this tree"; exit 1; }
  (cd "$BASE" && patch -s -R -p1 <"$PATCH")
  same=1
  for d in src include tools; do diff -rq "$ROOT/$d" "$BASE/$d" >/dev/null || same=0; done
  [ $same = 0 ] || { echo "gpu_ab: base and new have the same src/, include/ and tools/: nothing to compare"; exit 1; }
  echo "gpu_ab: building new ($ROOT) and base ($BASE)..."
  GPU_CHECK_OUT=$OUTDIR/build-new bash "$ROOT/scripts/gpu_check.sh" >"$OUTDIR/build-new.log" 2>&1 &
  pid=$!
  (cd "$BASE" && GPU_CHECK_OUT=$OUTDIR/build-base bash "$BASE/scripts/gpu_check.sh" >"$OUTDIR/build-base.log" 2>&1) ||
    { kill "$pid" 2>/dev/null; tail -20 "$OUTDIR/build-base.log"; echo "gpu_ab: base build failed"; exit 1; }
  wait "$pid" || { tail -20 "$OUTDIR/build-new.log"; echo "gpu_ab: new build failed"; exit 1; }
else
  echo "gpu_ab: building $ROOT; base = the same binary with ${BASE_ENV[*]}"
  GPU_CHECK_OUT=$OUTDIR/build-new bash "$ROOT/scripts/gpu_check.sh" >"$OUTDIR/build-new.log" 2>&1 ||
    { tail -20 "$OUTDIR/build-new.log"; echo "gpu_ab: build failed"; exit 1; }
fi
DEPS=$ROOT/build-deps/usr/lib/x86_64-linux-gnu
[ -d "$DEPS" ] && export LD_LIBRARY_PATH="$DEPS:${LD_LIBRARY_PATH:-}"

for r in $(seq 1 "$ROUNDS"); do
  for v in base new; do
    bin=$ROOT/build-cuda/qmoe
    run=(env)
    if [ "$v" = base ]; then
      if [ -n "$PATCH" ]; then bin=$BASE/build-cuda/qmoe; else run=(env "${BASE_ENV[@]}"); fi
    fi
    echo "gpu_ab: round $r, $v"
    "${run[@]}" "$bin" bench --device cuda "${ARGS[@]}" --csv "$OUTDIR/$v$r.csv" >"$OUTDIR/$v$r.log" 2>&1 ||
      { tail -5 "$OUTDIR/$v$r.log"; echo "gpu_ab: bench failed ($v, round $r)"; exit 1; }
  done
done

python3 - "$OUTDIR" "$ROUNDS" <<'PY'
import csv, os, sys
d, rounds = sys.argv[1], int(sys.argv[2])
def read(name):
    with open(os.path.join(d, name)) as f:
        return {(r["shape"], r["scheme"], r["T"]): float(r["us"]) for r in csv.DictReader(f)}
base = [read(f"base{r}.csv") for r in range(1, rounds + 1)]
new = [read(f"new{r}.csv") for r in range(1, rounds + 1)]
print("| shape | scheme | T | base µs (rounds) | new µs (rounds) | base / new |")
print("|---|---|---:|---|---|---:|")
for k in base[0]:
    b = [x[k] for x in base if k in x]
    n = [x[k] for x in new if k in x]
    if not n:
        continue
    fmt = lambda v: " / ".join(f"{x:.1f}" for x in v)
    print(f"| {k[0]} | {k[1]} | {k[2]} | {fmt(b)} | {fmt(n)} | {min(b) / min(n):.3f} |")
PY
