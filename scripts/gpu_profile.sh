#!/usr/bin/env bash
# Per-kernel profile of one layer call on an NVIDIA GPU (Nsight Compute), for the GPU performance
# work: for each (shape, scheme, T) point, `qmoe bench --device cuda` runs once under ncu and the
# layer's kernels (align, input quantization, GEMM1, activation, GEMM2, combine) are profiled with
# the Speed-of-Light, warp-state and compute/memory sections (clocks as found: --clock-control
# none). Prints one line per kernel: duration, DRAM / L2 / SM throughput, issue-slot use, the
# tensor pipe's busy share (HMMA and wgmma on bf16 / f16; INT8's IMMA reads 0 there), top stall
# reasons; the full CSVs stay in $PROFILE_OUT.
#
# Usage: scripts/gpu_profile.sh POINT...   with POINT = shape:scheme:T (after `make gpu-check` or
# gpu_check.sh has built $CUDA_BUILD). Example:
#   scripts/gpu_profile.sh mixtral-8x7b:w_mxfp4_a_mxfp4:16 qwen3-30b-a3b:unquantized+bf16act:4096
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${CUDA_BUILD:-$ROOT/build-cuda}
OUTDIR=${PROFILE_OUT:-$BUILD/profile}
mkdir -p "$OUTDIR"
NCU=${NCU:-ncu}
command -v "$NCU" >/dev/null || NCU=$(ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -x "$NCU" ] || NCU=$(find / -xdev -name ncu -type f -perm -u+x 2>/dev/null | head -1)
[ -x "$NCU" ] || { echo "gpu_profile: ncu not found"; exit 1; }
KERNELS='regex:gemm|align_kernel|prep_kernel|quant_input|act_kernel|act_vec_kernel|gather_rows|quant_rows|combine_kernel|absmax|route'

for point in "$@"; do
  IFS=: read -r shape scheme T <<<"$point"
  name=$(echo "${shape}_${scheme}_${T}" | tr -c 'A-Za-z0-9_.\n-' '_')
  csv=$OUTDIR/$name.csv
  # One layer call: the bench's first (warm-up) call is enough for per-kernel metrics; -c bounds
  # the kernels profiled (4–7 per call, 9 with the tensor-wide fp8 passes, one more with routing).
  "$NCU" --clock-control none -k "$KERNELS" -c 10 --csv --page raw \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    "$BUILD/qmoe" bench --device cuda --shapes "$shape" --schemes "$scheme" --tokens "$T" --reps 1 --copies 1 \
    --no-anchor >"$csv" 2>"$OUTDIR/$name.err" || { echo "ncu failed for $point:"; tail -5 "$OUTDIR/$name.err"; continue; }
  echo "== $point"
  python3 - "$csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = None
for i, r in enumerate(rows):
    if r and r[0] == "ID":
        hdr = r; units = rows[i + 1]; start = i + 2; break
if hdr is None:
    print("  (no ncu rows)"); sys.exit(0)
col = {h: j for j, h in enumerate(hdr)}
def g(r, k, d="-"):
    j = col.get(k)
    return r[j] if j is not None and j < len(r) else d
stalls = [h for h in hdr if h.startswith("smsp__average_warps_issue_stalled_") and h.endswith("_per_issue_active.ratio")]
for r in rows[start:]:
    if len(r) < len(hdr) // 2: continue
    name = g(r, "Kernel Name")[:60]
    st = []
    for h in stalls:
        try: st.append((float(g(r, h, "0").replace(",", "")), h[len("smsp__average_warps_issue_stalled_"):-len("_per_issue_active.ratio")]))
        except ValueError: pass
    st.sort(reverse=True)
    print(f"  {name:60s} {g(r,'gpu__time_duration.sum'):>9s} {units[col['gpu__time_duration.sum']] if 'gpu__time_duration.sum' in col else ''}  grid {g(r,'launch__grid_size'):>6s} regs {g(r,'launch__registers_per_thread'):>4s}"
          f" dram% {g(r,'gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed'):>6s} l2% {g(r,'lts__throughput.avg.pct_of_peak_sustained_elapsed'):>6s}"
          f" sm% {g(r,'sm__throughput.avg.pct_of_peak_sustained_elapsed'):>6s} issue% {g(r,'sm__inst_issued.avg.pct_of_peak_sustained_active'):>6s}"
          f" tensor% {g(r,'sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'):>6s}"
          f" occ% {g(r,'sm__warps_active.avg.pct_of_peak_sustained_active'):>6s}  stalls " + ", ".join(f"{n} {v:.2f}" for v, n in st[:4]))
PY
done
