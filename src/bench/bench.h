// The benchmark face: what `qmoe bench` (tools/qmoe/cmd_bench.cc) and `bench_cuda`
// (bench/cuda_bench.cc) share, so that the CPU and CUDA paths measure, count and report alike.
//
//   resolve(Options) → Plan      option checks: shapes, scheme entries (labels with +suffixes), tokens
//   run(Plan) → Report           the device's runner: random experts, weight copies rotated beyond the
//                                last-level cache (CPU) / L2 (CUDA), the read-bandwidth probe, timing
//   floors(bytes, flops, Limits) performance.md §4: memory floor, compute floor, which one binds
//   to_json / print_table / write_svg / write_csv   the outputs (one JSON object per point)
//
// Method (performance.md §4, §7): per point the median over `reps` timed repetitions; bytes = the
// touched experts' stored bytes + the activations in and out; FLOPs = 6·T·K·H·I. The §4 floor uses
// the nominal H200 figures (4.3 TB/s, 790 / 1580 TFLOP/s) on CUDA and the measured read bandwidth on
// the CPU (where no peak is known unless --peak-tflops gives one); every point also carries the
// bandwidth this same command measured and the % of it that the point reached.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qmoe/schemes.h"

namespace qmoe::bench {

// A standard layer shape (performance.md §3–4, plus two small shapes for quick runs).
struct Shape {
  const char* name;
  int E, K, H, I;
  bool gpt_oss;  // swigluoai (interleaved gate/up, alpha 1.702, limit 7) with biases (CPU runner)
};
const std::vector<Shape>& all_shapes();
const Shape& shape_by_name(const std::string& name);  // qmoe::Error listing the known names
// The four shapes of the GPU side-by-side (performance.md §10) and of `make gpu-check`.
inline constexpr const char* kStandardShapes = "mixtral-8x7b,deepseek-v3,qwen3-30b-a3b,gpt-oss-120b";

// One --scheme entry: a registry scheme plus CUDA variant suffixes, in any order:
//   +bf16act  CudaOptions::bf16_activations (CPU: OptimizedOptions::bf16_activations; the only
//             suffix the CPU takes — its hidden states are bf16 values already)
//   +xbf16    hidden states in bf16
//   +route    device routing in the timed graph   +nowg   no wgmma (mma.sync for every tile)
//   +tileN    CudaOptions::token_tile = N        +ksN    CudaOptions::ksplit = N (both GEMMs)
//   +f8mma    CudaOptions::fp8_mma (FP8 W8A8 on the e4m3 tensor cores)
// The label (the entry as written) is what tables, JSON and CSV print: bench_cuda's labels.
struct SchemeEntry {
  std::string label;
  const SchemeInfo* scheme = nullptr;
  bool bf16_act = false, x_bf16 = false, route = false, no_wgmma = false, fp8_mma = false;
  int token_tile = 0;
  int ksplit = 0;
  bool has_suffix() const { return label.find('+') != std::string::npos; }
};
SchemeEntry parse_scheme_entry(const std::string& entry);  // qmoe::Error on unknown names / suffixes

std::vector<std::string> split_list(const std::string& s);  // "a,,b" → {"a", "b"}
std::vector<int> parse_tokens(const std::string& s);        // positive integers, else qmoe::Error

struct Options {
  std::string device = "cpu";  // cpu | cuda
  std::string shapes = "qwen3-30b-a3b";
  std::string schemes = "w_mxfp4_a_mxfp4";  // "all": every registry scheme
  std::string tokens = "1,16,128";
  int threads = 0;                 // CPU: resolved by the caller (0: all cores)
  std::string kernel = "optimized";  // CPU: optimized | reference
  int reps = 5;
  int experts = 0;                 // override E
  double max_weight_gb = 0;        // 0: the device's default (CPU 8, CUDA 40)
  uint64_t seed = 1;
  double peak_tflops = 0;          // > 0: the compute peak for the floor (CPU has none otherwise)
  bool bf16_act = false;           // every entry +bf16act
  // CUDA only
  int copies = 0;                  // weight copies per graph (0: enough to touch ≥ 256 MB and 4 × L2)
  int token_tile = 0;
  bool anchor = true;              // the cuBLAS bf16 grouped-GEMM anchor per point
  double probe_gib = 4.0;          // read-bandwidth probe buffer (≥ 4 GiB on CUDA)
  // CUDA, several GPUs (qmoe/cuda_dist.h over NCCL): ep × tp ranks, one per GPU; `tokens` per EP rank
  int ep = 1, tp = 1;
  bool distributed = false;  // --ep / --tp given (also 1 x 1: the distributed path on one GPU)
};

struct Plan {
  Options opt;
  std::vector<const Shape*> shapes;
  std::vector<SchemeEntry> schemes;
  std::vector<int> tokens;  // sorted, unique
  double max_weight_gb = 0;
};
// Checks every option before any work (qmoe::Error saying which option and what was expected).
Plan resolve(const Options& o);

// ---- floors (performance.md §4) --------------------------------------------------------------
struct Limits {
  double mem_bytes_per_s = 0;  // read bandwidth for the memory floor
  double peak_flops = 0;       // 0: unknown → no compute floor
};
struct Floors {
  double mem_us = 0, compute_us = 0, floor_us = 0;  // compute_us = 0 when the peak is unknown
  char bound = 'M';                                 // M: memory, C: compute
};
Floors floors(double bytes, double flops, const Limits& lim);
double layer_flops(int T, int K, int H, int I);  // 6·T·K·H·I
// Expected unique experts under uniform routing: E·(1 − (1 − K/E)^T).
double expected_unique_experts(int E, int K, int T);
// One expert's stored bytes (weights + scales), estimated from the registry (memory checks).
double estimated_expert_bytes(const SchemeInfo& s, int H, int I);
// H200 nominals of §4: 4.3 TB/s; 790 TFLOP/s when the products run on bf16 MMA (bf16, W4A16,
// MXFP6 activations), 1580 when 8-bit MMA is possible (INT8 / FP8 W8A8, W4A4, W4A8).
inline constexpr double kH200BytesPerS = 4.3e12;
double h200_peak_flops(const SchemeInfo& s);

// Uniform routing: K distinct experts per token, positive weights summing to 1.
void random_routing(uint64_t seed, int T, int E, int K, std::vector<int32_t>& ids, std::vector<float>& w);

// ---- results --------------------------------------------------------------------------------
struct Point {
  std::string shape, scheme;  // scheme: the entry's label
  int tokens = 0, E = 0, K = 0, H = 0, I = 0, reps = 0;
  double median_us = 0, min_us = 0;
  double unique_experts = 0, touched_bytes = 0, flops = 0;
  double gbps = 0, tflops = 0;
  double bandwidth_gbps = 0;     // read bandwidth measured by this command
  double pct_of_bandwidth = 0;   // gbps / bandwidth_gbps
  double working_set_bytes = 0;  // weight copies × layer bytes
  int weight_copies = 1;
  Floors floor;                  // with the device's Limits (CUDA: §4 nominals)
  double measured_mem_floor_us = 0;  // touched_bytes / measured bandwidth
  // CUDA only (NaN elsewhere)
  double cublas_bf16_us = NAN;   // the in-run anchor at the same shape and routing
  double vllm_bf16_us = NAN, vllm_int8_us = NAN, vllm_fp8_us = NAN;  // performance.md §10 (H200)
};

struct Report {
  std::string device;  // cpu | cuda
  std::string kernel;
  std::string title;   // the SVG title
  std::string header;  // one line describing the machine (first line of the table)
  nlohmann::json device_fields = nlohmann::json::object();  // copied into every point's JSON
  std::string anchor_method;  // CUDA: how the cuBLAS anchor ran ("" elsewhere)
  std::vector<Point> points;
};

// The device's runner (CPU: bench_cpu.cc; CUDA: bench_cuda.cc, or a qmoe::Error saying CUDA is not
// built in). Progress goes to stderr.
Report run(const Plan& plan);
Report run_cpu(const Plan& plan);
Report run_cuda(const Plan& plan);
bool cuda_built_in();

// ep × tp > 1 (CUDA): the layer over this node's GPUs through NCCL (bench_dist.cc's method), both
// dispatches, against the same tokens on one GPU, with the all-to-all bandwidth measured in the same
// run. Prints a markdown table; `csv_path` non-empty: its CSV too.
void run_distributed(const Plan& plan, const std::string& csv_path);

// An array, one object per point: the common fields, then Report::device_fields (a CUDA point
// carries every key of a CPU point, null where it does not apply, plus its own).
nlohmann::json to_json(const Report& r);
void print_table(const Report& r);        // stdout: one row per point, then (CUDA) the summary table
// Two panels: µs per layer (log) and % of the measured read bandwidth, vs tokens (log).
std::string svg(const Report& r);
void write_svg(const std::string& path, const Report& r);
// bench_cuda's CSV: shape,scheme,T,U,us,GBps,TFLOPps,floor_us,bound,pct_floor,vllm_bf16_us,
// vllm_int8_us,vllm_fp8_us, then the added columns (mem_floor_us, bandwidth_GBps, pct_bandwidth,
// cublas_bf16_us). Outside tools join on the first ten: keep them.
std::string csv(const Report& r);
void write_csv(const std::string& path, const Report& r);
// The markdown summary: per (shape, scheme) µs and % of the floor per token count.
std::string summary_table(const Report& r);

}  // namespace qmoe::bench
