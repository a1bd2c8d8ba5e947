// An MoE layer: routing (spec §8), plan (per-expert token lists) and run (experts + combine).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qmoe/config.h"
#include "qmoe/params.h"

namespace qmoe {

// ---------------------------------------------------------------------------------------------
// Routing. logits [T, E] fp32 → ids [T, K] (global expert ids) and weights [T, K] fp32.
// Ties break toward the lower expert id. NaN / Inf in the logits: qmoe::Error naming the token.
// `correction_bias` [E] (may be null) is used for selection only.
void route(const RoutingConfig& rc, const float* logits, int T, int E, int K, const float* correction_bias,
           int32_t* topk_ids, float* topk_weights);
// The configuration checks of route (sizes, groups, bias presence) without the data: qmoe::Error
// naming the field. Shared by the CPU and device routing.
void validate_routing(const RoutingConfig& rc, int T, int E, int K, bool has_bias);

// Router logits = x [T, H] · W[E, H]ᵀ (+ bias [E]), fp32 products, fp64 accumulation rounded to fp32.
void compute_router_logits(const float* x, int T, int H, const Tensor& weight, const Tensor* bias, float* logits);

// ---------------------------------------------------------------------------------------------
// Expert computation (the kernels). out [T, H] is *accumulated into* (callers zero it).
struct ExpertsArgs {
  const ExpertParams* params = nullptr;
  const float* x = nullptr;         // [T, H] layer input (fp32 values; bf16 inputs are exact in fp32)
  int T = 0;
  int K = 0;
  const int32_t* topk_ids = nullptr;     // [T, K] global expert ids
  const float* topk_weights = nullptr;   // [T, K]
  bool router_weight_on_input = false;   // x ← x · w[t,0] before quantization (K must be 1)
  float* out = nullptr;                  // [T, H]
};

enum class Kernel { Reference, Optimized };

// Every expert entry point (experts_reference, experts_optimized, cuda::experts_cuda) and
// MoELayer::run / plan* refuse NaN / ±Inf in the hidden states (and topk weights / router logits)
// with a qmoe::Error naming the tensor and the first bad token: one pass over the input. There is
// no unchecked host path (docs/DECISIONS.md, "Non-finite inputs").
void check_experts_inputs(const ExpertsArgs& a, const char* who);

// The scalar reference: exact dequantized weights, fp64 accumulation, activations and the
// intermediate quantized exactly where the scheme says. THE SPEC for every other kernel.
void experts_reference(const ExpertsArgs& a);

// Optimized CPU kernels (threads × SIMD, in-kernel decode). `threads` ≤ 0: all cores.
void experts_optimized(const ExpertsArgs& a, int threads);

// ---------------------------------------------------------------------------------------------
// Plan / run.
struct MoEWorkspace {
  int T = 0, K = 0;
  std::vector<int32_t> topk_ids;      // [T, K]
  std::vector<float> topk_weights;    // [T, K]
  std::vector<int32_t> counts;        // [E_loc] slots per local expert
  std::vector<int32_t> offsets;       // [E_loc + 1] prefix sums
  std::vector<int32_t> sorted_slots;  // [offsets[E_loc]] slot ids t·K + k grouped by local expert
  std::vector<float> scratch;         // kernel scratch, grown as needed
};

// Runs the routed experts (and, with K = 1, the shared expert) on some device; adds into a.out
// like experts_reference. E.g. `[](const ExpertsArgs& a) { qmoe::cuda::experts_cuda(a); }`.
using ExpertsRunner = std::function<void(const ExpertsArgs&)>;

struct MoELayerOptions {
  LoadOptions load;
  Kernel kernel = Kernel::Optimized;
  int threads = 0;            // ≤ 0: all cores
  // Optimized CPU kernel, schemes that leave activations unquantized (unquantized, weight-only):
  // round the GEMM1 input and the intermediate to bf16 once (vLLM's precision, rel-L2 ~1e-3) —
  // fewer bf16 products per weight than the default fp32-accurate activations. The CPU
  // counterpart of cuda::CudaOptions::bf16_activations; quantized activations are unchanged.
  bool bf16_activations = false;
  ExpertsRunner runner;       // when set, run() computes the experts with it instead of the CPU kernels
  // from_checkpoint: called on the loaded routed experts before processing (qmoe::dist uses it to
  // reduce static activation scales over every EP rank's experts).
  std::function<void(ExpertParams&)> before_process;
};

class MoELayer {
 public:
  // Load layer `layer` of the checkpoint in `dir` (config.json + safetensors), process it.
  static MoELayer from_checkpoint(const std::string& dir, int layer, const MoELayerOptions& opt = {});
  // From parameters in memory (already processed or not; processed here).
  MoELayer(ModelConfig cfg, ExpertParams experts, std::optional<ExpertParams> shared = std::nullopt,
           Tensor router_weight = {}, Tensor router_bias = {}, Tensor correction_bias = {},
           Tensor shared_gate = {}, MoELayerOptions opt = {});

  const ModelConfig& config() const { return cfg_; }
  const ExpertParams& experts() const { return experts_; }
  const std::optional<ExpertParams>& shared_expert() const { return shared_; }
  const MoELayerOptions& options() const { return opt_; }
  void set_kernel(Kernel k) { opt_.kernel = k; }
  void set_threads(int n) { opt_.threads = n; }
  bool has_router() const { return router_weight_.defined(); }
  const Tensor& shared_gate() const { return shared_gate_; }  // undefined: no gate (weight 1)
  // The router's tensors as loaded (undefined when the checkpoint has none): weight [E, H], bias [E],
  // the selection-only e_score_correction_bias [E] (device layers upload them).
  const Tensor& router_weight() const { return router_weight_; }
  const Tensor& router_bias() const { return router_bias_; }
  const Tensor& correction_bias() const { return correction_bias_; }

  // Routing from logits [T, E] (or from hidden states through the router weight) into `ws`.
  void plan(const float* router_logits, int T, MoEWorkspace& ws) const;
  void plan_from_hidden(const float* x, int T, MoEWorkspace& ws) const;
  // out [T, H] = Σ_k w·expert(x) (+ shared expert). Thread-safe for separate workspaces.
  void run(const float* x, MoEWorkspace& ws, float* out) const;
  // The pieces of run(), for callers that split a layer across ranks (qmoe/dist.h): the routed
  // experts on given routing (global ids [T, K], experts this rank does not own are skipped) and the
  // shared expert (none: nothing), each *added* into out [T, H]. Inputs are not checked here.
  void run_routed(const float* x, int T, const int32_t* topk_ids, const float* topk_weights, float* out) const;
  void run_shared(const float* x, int T, float* out) const;

 private:
  void dispatch(const ExpertsArgs& a) const;
  ModelConfig cfg_;
  ExpertParams experts_;
  std::optional<ExpertParams> shared_;
  Tensor router_weight_, router_bias_, correction_bias_, shared_gate_;
  std::vector<float> correction_bias_f32_;
  // fp32 copies of the router weight / bias and the shared-expert gate, made once at construction
  // (plan_from_hidden and run_shared allocate nothing per call).
  std::vector<float> router_weight_f32_, router_bias_f32_, shared_gate_f32_;
  MoELayerOptions opt_;
};

}  // namespace qmoe
