// The quantizer: turns an unquantized Hugging Face MoE checkpoint into one whose expert linears are
// quantized exactly as AMD Quark exports them (checkpoint-format.md §3–§6), plus the two jobs built
// on it: the demo (quantize a synthetic layer with every scheme, run and compare) and the
// conformance-case verifier.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qmoe/formats.h"
#include "qmoe/moe.h"
#include "qmoe/safetensors.h"
#include "qmoe/schemes.h"

namespace qmoe {

// ---------------------------------------------------------------------------------------------
// One Linear.

struct LinearQuantOptions {
  // max |x| of the linear's input over the calibration tokens. Required by schemes with static
  // activation scales (act_is_static): fp8 / int8 static → `.input_scale` (+ `.input_zero_point`
  // for int8), NVFP4 → `.input_scale_2`. Ignored otherwise.
  std::optional<float> input_amax;
  // NVFP4: the amax that sets weight_scale_2 (default: max |W| of this weight). Quark's nvfp4
  // template shares one global scale between the gate_proj and up_proj of an expert
  // (shared_scale_groups), so the checkpoint quantizer passes max(amax_gate, amax_up) for both.
  std::optional<float> weight_amax;
  MxScaleMode mx_scale_mode = MxScaleMode::Even;  // MX shared-exponent rule of the weights
  int threads = 1;                                // rows are split over this many threads
};

// Quantize the weight W [out, in] (fp32, row-major: `out` rows of `in` input elements) of the Linear
// named `prefix` (e.g. "model.layers.0.mlp.experts.3.gate_proj") with `scheme`. Returns the tensors
// Quark writes for it, named prefix + suffix, in this order:
//   MX (fp4 / fp6):  .weight U8 [out, in/2] (fp4 pairs, even element low nibble) or [out, 3·in/4]
//                    (fp6 4-in-3 bytes); .weight_scale U8 [out, in/32] (E8M0, "even" rule unless
//                    options say otherwise); a_fp8 static: .input_scale F32 [] = amax/448.
//   NVFP4:           .weight U8 [out, in/2]; .weight_scale F8_E4M3 [out, in/16];
//                    .weight_scale_2 F32 [] = amax(|W|)/(6·448) (or weight_amax/(6·448)); .input_scale_2 F32 [] = amax/(6·448).
//   INT8:            .weight I8 [out, in]; .weight_scale F32 [] (per tensor) or [out] (per channel)
//                    = amax/127.5; .weight_zero_point I8 (zeros, shape of the scale); static:
//                    .input_scale F32 [] = amax/127 and .input_zero_point I8 [] (zero).
//   FP8:             .weight F8_E4M3 [out, in]; .weight_scale F32 [] or [out] = amax/448;
//                    static: .input_scale F32 [] = amax/448.
//   unquantized:     .weight BF16 [out, in].
// Errors (qmoe::Error naming the linear): `in` not a multiple of the block size, a static scheme
// without input_amax, non-finite weights.
std::vector<NamedTensor> quantize_linear(std::string_view prefix, const float* weight, int64_t out, int64_t in,
                                         const SchemeInfo& scheme, const LinearQuantOptions& opt = {});

// Names, dtypes and shapes of what quantize_linear writes (no data; `begin`/`end` are 0).
std::vector<TensorInfo> quantized_linear_layout(std::string_view prefix, int64_t out, int64_t in,
                                                const SchemeInfo& scheme);

// Exact fp32 dequantization of the tensors quantize_linear returned (looked up by name under
// `prefix`): W [out, in] row-major. Unquantized BF16 weights are returned as their values.
std::vector<float> dequantize_linear(std::string_view prefix, const std::vector<NamedTensor>& tensors,
                                     const SchemeInfo& scheme);

// ---------------------------------------------------------------------------------------------
// A whole checkpoint.

struct QuantizeOptions {
  // Extra exclude patterns (exact, glob or "re:<regex>", as in Quark's `exclude`); matched
  // experts are copied unquantized and the patterns are written into quantization_config.
  std::vector<std::string> exclude;
  // Calibration safetensors: `hidden_states` [N, H] (every MoE layer) and/or
  // `model.layers.L.hidden_states` [N, H] (layer L). Required by static schemes.
  std::string calib_path;
  int threads = 0;                          // ≤ 0: all hardware threads
  uint64_t shard_size = 5000000000ull;      // bytes per output shard (transformers' "5GB")
  bool progress = true;                     // progress on stderr (a bar on a terminal, else lines)
  // When set, progress goes to this callback instead of stderr (`progress` is then ignored):
  // called with the stage ("qmoe quantize: calibrating", "qmoe quantize: <scheme>"), the units
  // done and the total (source tensor bytes while writing, layers while calibrating) once at the
  // start of a stage, as work completes and once at its end (done == total). Calls are
  // serialised but may come from worker threads; an exception thrown by the callback stops the
  // job (nothing is written into dst) and is rethrown by quantize_checkpoint.
  std::function<void(const std::string& stage, uint64_t done, uint64_t total)> on_progress;
};

struct QuantizeReport {
  int quantized_linears = 0;        // expert linears written quantized
  int excluded_linears = 0;         // expert linears copied unquantized (excluded)
  int copied_tensors = 0;           // other tensors copied unchanged
  int shards = 0;                   // output safetensors files
  uint64_t total_bytes = 0;         // tensor data bytes written
  std::vector<std::string> excluded_layers;  // experts prefixes left unquantized, with the reason
  std::vector<std::string> files;   // files written into DST (names)
};

// Quantize every MoE expert linear (routed and shared experts) of the checkpoint in `src_dir` with
// `scheme` and write the result into `dst_dir` (created if needed): quantized tensors as Quark
// names them, every other tensor copied with its dtype, config.json = source config +
// "quantization_config" (keys sorted, indent 2), sharded with model.safetensors.index.json when
// larger than shard_size, other files of src_dir (generation_config.json, tokenizer files) copied.
// `scheme` "unquantized" copies the model and writes no quantization_config.
// Memory: the source is memory-mapped; at most one output shard is held in memory.
QuantizeReport quantize_checkpoint(const std::string& src_dir, const std::string& dst_dir, const SchemeInfo& scheme,
                                   const QuantizeOptions& opt = {});

// The exclude list written for a model type: lm_head, attention, the router (and the Qwen2-MoE
// shared-expert gate), followed by `extra`.
std::vector<std::string> default_exclude_patterns(std::string_view model_type, const std::vector<std::string>& extra);

// ---------------------------------------------------------------------------------------------
// Synthetic checkpoints (demo and tests).

struct SyntheticShape {
  std::string name;        // "tiny", "small" (default demo), "qwen3-30b-a3b", ...
  std::string model_type;  // qwen3_moe, mixtral, qwen2_moe, deepseek_v3, gpt_oss
  int hidden = 0, inter = 0, experts = 0, top_k = 0;
};
// Known demo shapes; `name` lookup throws qmoe::Error listing them.
std::vector<SyntheticShape> synthetic_shapes();
const SyntheticShape& synthetic_shape(std::string_view name);

// Write a BF16 checkpoint (config.json + model.safetensors) of `shape` into `dir`: one MoE layer
// (tiny-deepseek: a dense layer 0 and an MoE layer 1 with a shared expert; tiny-qwen2: a shared
// expert with its gate), expert weights ~ N(0, 0.02) with rare outliers (an element is ±5σ…10σ with probability 1e-4), router
// ~ N(0, 0.08). `other_modules` adds attention projections, norms, embeddings and lm_head.
// Deterministic for a seed.
void write_synthetic_checkpoint(const std::string& dir, const SyntheticShape& shape, uint64_t seed,
                                bool other_modules = false);
// Hidden states [T, H] ~ N(0, 1), rounded to bf16 values (deterministic for a seed).
std::vector<float> synthetic_hidden_states(int T, int H, uint64_t seed);

// ---------------------------------------------------------------------------------------------
// The demo (`qmoe demo`): a synthetic layer quantized with every registry scheme, loaded back
// through MoELayer::from_checkpoint, run and compared with the unquantized fp32 layer.

// Computes out [T, H] = layer(x) for the routing planned in `ws` on some device and returns the
// time of the computation in µs.
using DemoRunner = std::function<double(const float* x, const MoEWorkspace& ws, float* out)>;

// An extra device (e.g. CUDA, provided by the CLI): `prepare` uploads a loaded layer for up to T
// tokens of top-K routing and returns its runner.
struct DemoDevice {
  std::string name;
  std::function<DemoRunner(const MoELayer& layer, int T, int K)> prepare;
};

struct DemoOptions {
  std::string shape = "small";   // synthetic_shape name
  int tokens = 64;               // T
  bool cpu = true;               // run on the CPU (Kernel::Optimized)
  std::vector<DemoDevice> devices;  // further devices
  std::string out_dir;           // checkpoints + tables here; "" → temp checkpoints, tables in ./demo-out
  int threads = 0;               // ≤ 0: all hardware threads
  int repeats = 5;               // timed runs per device (median), after one warm-up
  uint64_t seed = 1234;
  bool progress = true;          // progress on stderr
};

struct DemoDeviceResult {
  std::string device;
  double rel_l2 = 0.0;           // ‖out − ref‖ / ‖ref‖ vs the unquantized fp32 layer
  double us_per_layer = 0.0;     // median run() time (routing planned once)
  double tokens_per_s = 0.0;
};

struct DemoRow {
  std::string scheme;
  double bits_per_weight = 0.0;
  double checkpoint_mb = 0.0;    // safetensors bytes / 1e6
  // rel L2 between the optimized CPU kernel and the scalar reference kernel on the first tokens of
  // the same quantized layer (−1: not run); a row fails above 2e-2.
  double kernel_check = -1.0;
  std::vector<DemoDeviceResult> devices;
  bool ok = true;
  std::string error;
};

struct DemoResult {
  SyntheticShape shape;
  int tokens = 0;
  std::vector<std::string> devices;
  std::vector<DemoRow> rows;
  std::string csv_path, json_path;
  bool all_ok() const;
  std::string table() const;     // the human-readable table
};

// Run the demo; every scheme of the registry gets a row (a failing scheme records its error).
DemoResult run_demo(const DemoOptions& opt);

// ---------------------------------------------------------------------------------------------
// Conformance verification (`qmoe verify`, conformance/README.md).

struct VerifyOptions {
  std::vector<Kernel> kernels{Kernel::Reference, Kernel::Optimized};  // CPU kernels to check
  std::string device = "cpu";     // label of the device
  ExpertsRunner runner;           // when set: run the experts with it instead of the CPU kernels
  int threads = 0;
};

struct VerifyRow {
  std::string case_name, scheme, kernel, device;
  double rel_l2 = -1.0, tolerance = -1.0;   // −1: not applicable (error cases)
  double routing_agreement = -1.0;          // % of top-k ids equal to the expected ones
  bool pass = false;
  std::string message;                      // failure reason / the error an error case raised
};

// Run one case directory (case.json, config.json, model.safetensors, io.safetensors).
std::vector<VerifyRow> verify_case(const std::string& case_dir, const VerifyOptions& opt);
// Arguments → case directories: a directory with case.json, or a directory whose subdirectories
// have one (e.g. conformance/cases), sorted.
std::vector<std::string> expand_case_dirs(const std::vector<std::string>& args);
std::string verify_table(const std::vector<VerifyRow>& rows);

}  // namespace qmoe
