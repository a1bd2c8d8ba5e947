// CUDA backend (NVIDIA Hopper, sm_90a): the MoE expert computation on the GPU.
//
// No CUDA header is needed to use this one: device pointers are plain pointers, the stream is a
// `void*` holding a cudaStream_t (nullptr = the legacy default stream).
//
// Numerics (spec quark-moe.md §9, §16.6): weights are decoded inside the GEMM kernels to bf16
// (every stored format is exact in bf16: e2m1 / fp6 / fp8 codes times their E8M0 or FP8 block
// scale), accumulation is fp32 (int32 for INT8 W8A8), per-channel / per-tensor / global scales are
// applied in fp32 after the accumulation, bias and activation are fp32, the intermediate is
// quantized from fp32 exactly as the scheme says (formats.h functions, IEEE divisions), the router
// weight is applied in fp32 and the top-k sum is fp32 in a fixed order (deterministic output).
// Activations that the scheme does not quantize (weight-only and unquantized schemes) are fed to
// the bf16 tensor cores as a bf16 hi + lo pair (fp32-accurate) unless `CudaOptions::bf16_activations`
// asks for the faster single bf16 rounding that vLLM uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qmoe/moe.h"
#include "qmoe/params.h"

namespace qmoe::cuda {

// True when the library was built with CUDA and a device is visible.
bool available();

// Device routing (qmoe::route's semantics, spec §8) on `stream`: logits [T, E] (F32, BF16 or
// F16) → topk_ids [T, K] int32 global ids, topk_weights [T, K] fp32; the correction bias [E] is
// fp32 on the device (or null). Stream-ordered, no host synchronisation, capturable. The ids equal
// route()'s up to exact fp32 score ties; the weights equal them within a few fp32 ulps. A token
// with a non-finite logit gets ids 0..K−1 and NaN weights (its output row becomes NaN); check
// inputs on the host first where an error is wanted. Config errors: qmoe::Error, before launch.
void route_device(const RoutingConfig& rc, const void* d_logits, DType logits_dtype, int T, int E, int K,
                  const float* d_correction_bias, int32_t* d_topk_ids, float* d_topk_weights, void* stream);
int device_count();
// "NVIDIA H200 (sm_90, 132 SMs, 143771 MiB)" or "" when there is no device.
std::string device_description(int device = 0);

// The token tiles a GEMM launch takes (CudaOptions::token_tile, `qmoe bench --token-tile`).
inline constexpr int kTokenTiles[] = {8, 16, 32, 64, 128};
constexpr bool is_token_tile(int t) {
  for (int v : kTokenTiles)
    if (t == v) return true;
  return false;
}
// The most K splits a GEMM launch takes (CudaOptions::ksplit, the bench's +ksN).
inline constexpr int kMaxKSplit = 16;

struct CudaOptions {
  // Weight-only / unquantized schemes: round activations and the intermediate to bf16 once
  // (vLLM's precision, rel-L2 ~1e-3) instead of the exact bf16 hi + lo split (2 MMAs).
  bool bf16_activations = false;
  // FP8 W8A8 schemes: token tiles of 64 and up on the e4m3 tensor cores (wgmma on e4m3 weights and
  // activation codes, each 128-K stage's sum added into fp32) instead of fp16 MMAs on the decoded
  // codes. Products stay exact, but Hopper's fp8 MMA adds them with ~13 fraction bits, so the
  // intermediate's FP8 quantization can land on the neighbouring grid point: vLLM's precision
  // class (rel-L2 ~1e-3 .. 1e-2, as bf16_activations), not the fp32-accurate default.
  bool fp8_mma = false;
  // With fp8_mma: which e4m3 kernel — 0 gemm_wg_f8_kernel, 1 / 2 the warp-specialised
  // gemm_ws_f8_kernel with one / two weight tiles per CTA; -1 = env QMOE_CUDA_F8 (wg | ws1 | ws2),
  // else 2. For tests and measurements.
  int fp8_kernel = -1;
  // Activation tiles by TMA on the warp-specialised wgmma kernel (64- and 128-token tiles): 0 off
  // (cp.async gathers), 1 GEMM2 always and GEMM1 where 2 · intermediate ≥ 4096 (its operand is first
  // gathered into tile order), 2 both GEMMs always; 3 / 4 as 1 / 2 on 128-token tiles only (the
  // rule before 2026-12-06); -1 = env QMOE_CUDA_TMA (0 | 1 | all | 128 | all128), else 1. For tests
  // and measurements.
  int tma = -1;
  // The warp-specialised wgmma kernels persistent (one CTA per SM, each looping over tiles, so the
  // next tile's loads overlap the current one's end): 0 off, 1 on; -1 = env QMOE_CUDA_PERSIST (0 | 1),
  // else 1; n ≥ 2: at most n CTAs (tests: many tiles per CTA on small problems). For tests and
  // measurements.
  int persist = -1;
  int token_tile = 0;  // tokens per GEMM tile (kTokenTiles); 0 = chosen from tokens per expert
  int ksplit = 0;      // K splits of each GEMM (partials summed in a fixed order); 0 = auto
  // Tiles of 32 tokens and up on Hopper's warpgroup MMA where the tile table picks it (sm_90a
  // builds on a compute-capability 9.0 device; QMOE_CUDA_WGMMA=0 turns it off process-wide);
  // false: the mma.sync kernel for every tile.
  bool wgmma = true;
  int device = 0;
};

// The routed experts of one layer resident on a GPU. The constructor validates and uploads the
// (processed) parameters once, repacked for the kernels: rows padded to 128 and K to one pipeline
// stage (64 for bf16, 128 otherwise), weights tile-major (each 128-row × stage block contiguous;
// FP4 codes in MMA-fragment order), block scales regrouped per stage. Not copyable; movable.
class CudaExperts {
 public:
  explicit CudaExperts(const ExpertParams& p, const CudaOptions& opt = {});
  // Random parameters generated on the device (benchmarks): codes uniform over the finite values
  // of the format, plausible scales. `act` gives the activation; E_loc = E, or with `expert_map`
  // ([E] global → local, −1 = not here) the experts it maps (an EP rank's share).
  static CudaExperts random(const SchemeInfo& scheme, int num_experts, int hidden, int inter,
                            const ActivationSpec& act, uint64_t seed, const CudaOptions& opt = {},
                            const std::vector<int>& expert_map = {});
  ~CudaExperts();
  CudaExperts(CudaExperts&&) noexcept;
  CudaExperts& operator=(CudaExperts&&) noexcept;
  CudaExperts(const CudaExperts&) = delete;
  CudaExperts& operator=(const CudaExperts&) = delete;

  // Plan: size the work buffers for up to `max_tokens` tokens of top-`top_k` routing. The launch
  // configuration of a call depends only on (T, K) and the options, so a captured graph replays
  // the same grid. No allocation happens in run_device afterwards.
  void reserve(int max_tokens, int top_k);

  // Stream-ordered, no host synchronisation, no allocation: capturable in a CUDA graph.
  // d_x [T, H] fp32, d_topk_ids [T, K] int32 (global ids), d_topk_weights [T, K] fp32,
  // d_out [T, H] fp32: out += Σ_k w·expert(x) (or out = … when accumulate is false).
  // Requires reserve(≥ T, K) first. The inputs are not checked: a token whose hidden-state row
  // (times its routing weight, with router_weight_on_input) holds NaN or ±Inf gets a NaN output
  // row and leaves every other row as it would be with that row zeroed (docs/DECISIONS.md).
  void run_device(const float* d_x, int T, int K, const int32_t* d_topk_ids, const float* d_topk_weights,
                  float* d_out, bool router_weight_on_input, bool accumulate, void* stream) const;
  // The same with the hidden states in the engine's dtype: x_dtype F32, BF16 or F16 ([T, H]
  // row-major), read directly by the input quantizer (no conversion pass). A BF16 input is exact
  // in bf16, so weight-only and unquantized schemes run GEMM1 with one MMA instead of hi + lo;
  // the result equals run_device on the same values as fp32, bit for bit.
  void run_device(const void* d_x, DType x_dtype, int T, int K, const int32_t* d_topk_ids,
                  const float* d_topk_weights, float* d_out, bool router_weight_on_input, bool accumulate,
                  void* stream) const;

  // Host convenience: copies the ExpertsArgs inputs to the device, runs, adds into a.out, syncs.
  // a.params is ignored (this object's parameters are used).
  void run_host(const ExpertsArgs& a) const;

  int hidden() const;
  int inter() const;
  int num_experts() const;
  int num_local() const;
  const SchemeInfo& scheme() const;
  // Device bytes of one local expert's stored weights + scales (unpadded, as the checkpoint
  // stores them), used for bandwidth figures.
  double expert_bytes() const;

  struct Impl;

 private:
  CudaExperts();
  std::unique_ptr<Impl> impl_;
};

// experts_reference's signature on the GPU: uploads a.params, runs, adds into a.out.
void experts_cuda(const ExpertsArgs& a, const CudaOptions& opt = {});

// A whole MoE layer resident on one GPU: routing (from the engine's router logits, or from the
// hidden states through the checkpoint's router weight), the routed experts and the shared
// expert (with its sigmoid gate), all on one stream — what MoELayer::run computes on the host.
// Built from a loaded MoELayer (its parameters are uploaded once; the MoELayer may go away after).
// With expert parallelism (the layer loaded with ep_size > 1) the output holds this rank's routed
// experts, plus the shared expert on EP rank 0, as MoELayer::run.
//
// Numerics: router logits are fp32 products summed in fp64 and rounded once to fp32
// (compute_router_logits' rule; the summation order differs, so a logit can differ from the
// host's by an fp32 rounding in rare near-ties), routing is route_device's, the experts are
// CudaExperts'. Inputs are not checked (a NaN token gets a NaN output row and NaN routing weights,
// as CudaExperts::run_device documents); host entry points (MoELayer::run) check them.
class CudaLayer {
 public:
  explicit CudaLayer(const MoELayer& layer, const CudaOptions& opt = {});
  ~CudaLayer();
  CudaLayer(CudaLayer&&) noexcept;
  CudaLayer& operator=(CudaLayer&&) noexcept;
  CudaLayer(const CudaLayer&) = delete;
  CudaLayer& operator=(const CudaLayer&) = delete;

  // Size the work buffers for up to `max_tokens` tokens (allocates; synchronises the device when
  // they grow). run_device reserves by itself when called with more tokens outside a stream
  // capture; inside a capture it cannot allocate, so reserve (or run once eagerly) before capturing.
  void reserve(int max_tokens);
  int reserved_tokens() const;

  // x [T, H] (F32, BF16 or F16, row-major), logits [T, E] (F32, BF16 or F16) or null to compute
  // them from x with the router weight (has_router()); writes out [T, H] fp32 (overwritten),
  // topk_ids [T, K] int32 (global ids) and topk_weights [T, K] fp32. Stream-ordered, no host
  // synchronisation, no allocation once reserved: capturable in a CUDA graph. Runs on the layer's
  // device whatever the calling thread's current device is (and restores it). Calls on different
  // streams are ordered one after the other (the work buffers are shared): a call first waits for
  // the previous call's work, except inside a stream capture (capture from a quiet device).
  // Calls from several host threads are serialised.
  void run_device(const void* d_x, DType x_dtype, int T, const void* d_logits, DType logits_dtype, float* d_out,
                  int32_t* d_topk_ids, float* d_topk_weights, void* stream) const;

  // Blocks the host until the last eager run_device call's work is done (nothing when none).
  void synchronize() const;

  int device() const;
  int hidden() const;
  int num_experts() const;
  int top_k() const;
  bool has_router() const;
  bool has_shared_expert() const;  // on this rank (EP rank 0 only)
  const CudaExperts& experts() const;
  const CudaExperts* shared_expert() const;  // null when none on this rank

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Router logits on the device: logits [T, E] fp32 = x [T, H] (F32 / BF16 / F16) · W [E, H]ᵀ
// (+ bias [E]) with compute_router_logits' rule (fp32 products, fp64 sums, one rounding); with
// `sigmoid` the values are 1 / (1 + exp(−v)) instead (a shared-expert gate, E = 1). All pointers
// on the device; W and bias fp32. Stream-ordered, capturable.
void router_logits_device(const void* d_x, DType x_dtype, int T, int H, const float* d_w, const float* d_bias, int E,
                          bool sigmoid, float* d_logits, void* stream);

}  // namespace qmoe::cuda
