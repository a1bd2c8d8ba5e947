// The optimized CPU expert computation: same math as experts_reference (src/cpu/ref), organised
// for speed. Per chunk of ≤ chunk_tokens tokens, inside one thread-pool region:
//   A  quantize each token's GEMM1 input once (all experts reuse it)
//   B  GEMM1 tasks = (local expert, tile of output rows) over that expert's gathered tokens,
//      dynamically scheduled, experts with most tokens first; weights decoded in registers
//   C  activation per slot (fp32 GEMM1 outputs, never rounded to bf16) → intermediate quantization
//   D  GEMM2 tasks likewise (+ bias, × router weight)
//   E  combine out[t] += Σ_k y2[t, k] in k order
// Each output element is produced by one task in a fixed order, so results do not depend on the
// thread count. Scratch belongs to the calling thread (thread_local), so concurrent calls from
// different threads are independent. Fp8 dynamic per-tensor intermediates need the max over all
// slots first: with more than one chunk, a first pass computes GEMM1 + activation for the max only.
#include "cpu/experts_optimized.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <numeric>
#include <vector>

#include "cpu/kernel_iface.h"
#include "cpu/ref/ref_ops.h"
#include "cpu/thread_pool.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"

namespace qmoe {

namespace cpu {

namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

WeightView make_view(const ExpertParams& p, ref::Proj which, int e) {
  const SchemeInfo& s = *p.scheme;
  const bool w13 = which == ref::Proj::W13;
  WeightView v;
  v.fmt = s.weight;
  v.rows = w13 ? 2 * p.inter : p.hidden;
  v.cols = w13 ? p.hidden : p.inter;
  const Tensor& w = w13 ? p.w13_weight : p.w2_weight;
  const Tensor& sc = w13 ? p.w13_weight_scale : p.w2_weight_scale;
  v.dtype = w.dtype();
  const int64_t esz = s.weight == WeightFormat::BF16 ? dtype_bits(w.dtype()) / 8 : 1;
  v.row_bytes = weight_packed_cols(s.weight, v.cols) * esz;
  v.data = reinterpret_cast<const uint8_t*>(w.data()) + static_cast<int64_t>(e) * v.rows * v.row_bytes;
  switch (s.weight_scale) {
    case WeightScale::None: break;
    case WeightScale::PerTensor: v.tensor_scale = sc.data_as<float>()[e]; break;
    case WeightScale::PerChannel: v.channel_scale = sc.data_as<float>() + static_cast<int64_t>(e) * v.rows; break;
    case WeightScale::MxE8M0:
      v.scales = reinterpret_cast<const uint8_t*>(sc.data()) + static_cast<int64_t>(e) * v.rows * (v.cols / kMxBlock);
      break;
    case WeightScale::Nvfp4:
      v.scales = reinterpret_cast<const uint8_t*>(sc.data()) + static_cast<int64_t>(e) * v.rows * (v.cols / kNvfp4Block);
      v.nv_global = (w13 ? p.w13_weight_scale_2 : p.w2_weight_scale_2).data_as<float>()[e];
      break;
  }
  const Tensor& b = w13 ? p.w13_bias : p.w2_bias;
  if (b.defined()) {
    v.bias_dtype = b.dtype();
    v.bias = reinterpret_cast<const uint8_t*>(b.data()) + static_cast<int64_t>(e) * v.rows * (dtype_bits(b.dtype()) / 8);
  }
  return v;
}

// Grow-only 64-byte aligned buffer.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(ptr_); }
  uint8_t* get(int64_t bytes) {
    const size_t n = static_cast<size_t>(round_up(std::max<int64_t>(bytes, 64), 4096));
    if (n > cap_) {
      std::free(ptr_);
      ptr_ = nullptr;
      cap_ = 0;
      ptr_ = std::aligned_alloc(64, n);
      if (ptr_ == nullptr) throw std::bad_alloc();
      cap_ = n;
    }
    return static_cast<uint8_t*>(ptr_);
  }
  template <class T>
  T* as(int64_t count) {
    return reinterpret_cast<T*>(get(count * static_cast<int64_t>(sizeof(T))));
  }

 private:
  void* ptr_ = nullptr;
  size_t cap_ = 0;
};

struct Task {
  int e, row0, row1;
};

// Per calling thread.
struct Scratch {
  AlignedBuffer act1, y1, z, act2, y2;
  std::vector<int32_t> count, offset, fill, tok_of_pos, pos_of_slot, pos_index, order;
  std::vector<float> rw_of_pos, zmax_of_pos;
  std::vector<Task> tasks1, tasks2;
  std::vector<WeightView> v13, v2;  // the call's per-expert views (kept: no allocation per call)
};

Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

void validate_args(const ExpertsArgs& a) {
  if (a.params == nullptr) throw Error("experts_optimized: ExpertsArgs.params is null");
  if (a.T < 0) throw Error(fmt::format("experts_optimized: token count T = {} is negative", a.T));
  if (a.K < 1) throw Error(fmt::format("experts_optimized: top_k K = {} must be at least 1", a.K));
  if (a.T > 0 && (a.x == nullptr || a.out == nullptr || a.topk_ids == nullptr || a.topk_weights == nullptr))
    throw Error("experts_optimized: ExpertsArgs.x, out, topk_ids and topk_weights must all be set");
  if (a.router_weight_on_input && a.K != 1)
    throw Error(fmt::format("experts_optimized: apply_router_weight_on_input needs top_k == 1, got K = {}", a.K));
}

// Row tiles of `rows` output rows for the experts in `order` (most tokens first): ~6 per thread,
// 16 to 1024 rows. Each task starts its weight stream cold (the software prefetch runs ahead only
// within it), so tiles stay long: at 256 rows a GEMM2 task of qwen3-30b-a3b (768-wide rows) was
// 100 KB of 4-bit weights and the layer 9-15% slower at T = 16 (bench/RESULTS.md 2026-12-03 evening).
void make_tasks(const std::vector<int32_t>& order, const std::vector<int32_t>& count, int rows, int nthreads,
                std::vector<Task>& tasks) {
  tasks.clear();
  int64_t total_rows = 0;
  for (int32_t e : order)
    if (count[static_cast<size_t>(e)] > 0) total_rows += rows;
  if (total_rows == 0) return;
  const int64_t target = std::max<int64_t>(1, total_rows / (6LL * nthreads));
  const int tile = static_cast<int>(std::clamp<int64_t>(round_up(target, 16), 16, 1024));
  // The last ~2 tiles per thread shrink (guided, to 1/(2·threads) of the rows left, at least 64), so
  // that the threads finish the phase together rather than one waiting on another's last long tile.
  int64_t left = total_rows;
  for (int32_t e : order) {
    if (count[static_cast<size_t>(e)] == 0) continue;
    for (int r = 0; r < rows;) {
      const int64_t guided = std::clamp<int64_t>(round_up(left / (2LL * nthreads), 16), 64, tile);
      const int r1 = std::min<int64_t>(rows, r + (nthreads > 1 ? guided : tile));
      tasks.push_back({e, r, r1});
      left -= r1 - r;
      r = r1;
    }
  }
}

struct Call {
  const ExpertsArgs* a;
  const ExpertParams* p;
  const KernelTable* kt;
  int nthreads;
  int H, I, K;
  ref::ActQuantRule rule1, rule2;
  ActLayout L1, L2;
  const std::vector<WeightView>* v13 = nullptr;  // per local expert (Scratch::v13 / v2)
  const std::vector<WeightView>* v2 = nullptr;
  float scale1 = 0.0f;  // Fp8DynTensor GEMM1 input scale
  bool round1 = false, round2 = false;  // OptimizedOptions::bf16_activations for an unquantized input
  ActParams act;
};

enum class Stage { MaxOnly, Full };

// Elements below which a non-GEMM phase runs on the calling thread alone (a decode step's 8 slots
// of 768 do; qwen3-30b-a3b at T = 16, 128 slots: the activation 160 -> 90 µs, NVFP4's intermediate
// quantization 210 -> 140 µs on two threads, bench/RESULTS.md 2026-12-03 evening).
constexpr int64_t kParallelElems = int64_t{1} << 14;

float nan_max(float a, float b) { return (std::isnan(a) || std::isnan(b)) ? NAN : std::max(a, b); }

// Runs tokens [t0, t0 + nt). Stage::MaxOnly returns the max |z| over the chunk's local slots;
// Stage::Full uses `scale2` (Fp8DynTensor intermediate scale; < 0: compute it from this chunk).
float run_chunk(const Call& c, Scratch& s, int t0, int nt, Stage stage, float scale2) {
  const ExpertsArgs& a = *c.a;
  const ExpertParams& p = *c.p;
  const int K = c.K, H = c.H, I = c.I, R13 = 2 * I, E_loc = p.num_local;
  const int64_t nslots = static_cast<int64_t>(nt) * K;

  // Plan: positions grouped by local expert, slots in increasing order within an expert.
  s.count.assign(static_cast<size_t>(E_loc), 0);
  s.pos_of_slot.assign(static_cast<size_t>(nslots), -1);
  for (int64_t q = 0; q < nslots; ++q) {
    const int l = p.expert_map[static_cast<size_t>(a.topk_ids[static_cast<int64_t>(t0) * K + q])];
    if (l >= 0) ++s.count[static_cast<size_t>(l)];
  }
  s.offset.assign(static_cast<size_t>(E_loc) + 1, 0);
  for (int e = 0; e < E_loc; ++e) s.offset[static_cast<size_t>(e) + 1] = s.offset[static_cast<size_t>(e)] + s.count[static_cast<size_t>(e)];
  const int P = s.offset[static_cast<size_t>(E_loc)];
  if (P == 0) return 0.0f;
  s.fill.assign(s.offset.begin(), s.offset.end() - 1);
  s.tok_of_pos.resize(static_cast<size_t>(P));
  s.rw_of_pos.resize(static_cast<size_t>(P));
  s.pos_index.resize(static_cast<size_t>(P));
  s.zmax_of_pos.assign(static_cast<size_t>(P), 0.0f);
  for (int64_t q = 0; q < nslots; ++q) {
    const int64_t slot = static_cast<int64_t>(t0) * K + q;
    const int l = p.expert_map[static_cast<size_t>(a.topk_ids[slot])];
    if (l < 0) continue;
    const int pos = s.fill[static_cast<size_t>(l)]++;
    s.pos_of_slot[static_cast<size_t>(q)] = pos;
    s.tok_of_pos[static_cast<size_t>(pos)] = static_cast<int32_t>(q / K);
    s.rw_of_pos[static_cast<size_t>(pos)] = a.topk_weights[slot];
  }
  std::iota(s.pos_index.begin(), s.pos_index.end(), 0);
  s.order.resize(static_cast<size_t>(E_loc));
  std::iota(s.order.begin(), s.order.end(), 0);
  // Most tokens first, ties in expert order (std::sort with the index as tie-break: stable_sort's
  // order without its temporary buffer).
  std::sort(s.order.begin(), s.order.end(), [&](int32_t x, int32_t y) {
    const int32_t cx = s.count[static_cast<size_t>(x)], cy = s.count[static_cast<size_t>(y)];
    return cx != cy ? cx > cy : x < y;
  });
  make_tasks(s.order, s.count, R13, c.nthreads, s.tasks1);
  make_tasks(s.order, s.count, H, c.nthreads, s.tasks2);

  uint8_t* act1 = s.act1.get(static_cast<int64_t>(nt) * c.L1.stride);
  float* y1 = s.y1.as<float>(static_cast<int64_t>(P) * R13);
  float* z = s.z.as<float>(static_cast<int64_t>(P) * I);
  uint8_t* act2 = stage == Stage::Full ? s.act2.get(static_cast<int64_t>(P) * c.L2.stride) : nullptr;
  float* y2 = stage == Stage::Full ? s.y2.as<float>(static_cast<int64_t>(P) * H) : nullptr;
  const KernelTable& kt = *c.kt;

  // QMOE_CPU_PROFILE=1: member 0 stamps the end of each phase (each ends with a barrier).
  static const bool profile = std::getenv("QMOE_CPU_PROFILE") != nullptr;
  double stamps[8] = {};
  int nstamps = 0;
  const auto t_start = std::chrono::steady_clock::now();
  auto stamp = [&](const Team& team) {
    if (profile && team.id() == 0)
      stamps[nstamps++] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t_start).count();
  };
  ThreadPool::instance().run(c.nthreads, [&](Team& team) {
    thread_local std::vector<float> tmp;  // per member thread, grown only
    // Small phases (quantization, activation, combine) run on the caller unless they are large:
    // on a shared machine, waiting for a descheduled helper costs more than the work.
    auto small_loop = [&](int64_t n, int64_t elems, auto&& f) {
      if (elems < kParallelElems) team.for_each_on_caller(n, f);
      else team.for_each(n, f);
    };
    // A: GEMM1 inputs, once per token.
    small_loop(nt, static_cast<int64_t>(nt) * H, [&](int64_t i) {
      const int t = t0 + static_cast<int>(i);
      const float* x = a.x + static_cast<int64_t>(t) * H;
      if (a.router_weight_on_input || c.round1) {
        tmp.resize(static_cast<size_t>(H));
        const float w = a.router_weight_on_input ? a.topk_weights[t] : 1.0f;
        for (int h = 0; h < H; ++h) tmp[static_cast<size_t>(h)] = c.round1 ? bf16_round(x[h] * w) : x[h] * w;
        x = tmp.data();
      }
      QuantRowArgs q{&c.rule1, &c.L1, c.scale1, x, act1 + i * c.L1.stride};
      kt.quantize_row(q);
    });
    stamp(team);
    // One grouped GEMM phase: every (local expert, row tile) task over that expert's tokens.
    // act_index: per position, the activation row to read; post_mul: per position (or null).
    auto gemm_phase = [&](const std::vector<Task>& tasks, const auto& weights, const auto& layout,
                          const uint8_t* act_base, const int32_t* act_index, float* out, int ldo,
                          const float* post_mul) {
      team.for_each(static_cast<int64_t>(tasks.size()), [&](int64_t ti) {
        const Task& tk = tasks[static_cast<size_t>(ti)];
        const int off = s.offset[static_cast<size_t>(tk.e)];
        GemmArgs g;
        g.w = &weights[static_cast<size_t>(tk.e)];
        g.layout = &layout;
        g.act_base = act_base;
        g.act_index = act_index + off;
        g.ntok = s.count[static_cast<size_t>(tk.e)];
        g.row0 = tk.row0;
        g.row1 = tk.row1;
        g.out = out + static_cast<int64_t>(off) * ldo;
        g.ldo = ldo;
        g.post_mul = post_mul ? post_mul + off : nullptr;
        kt.gemm(g);
      });
    };
    // B: GEMM1.
    gemm_phase(s.tasks1, *c.v13, c.L1, act1, s.tok_of_pos.data(), y1, R13, nullptr);
    stamp(team);
    // C1: activation (+ per-slot max for a dynamic per-tensor intermediate scale); C2: the
    // intermediate quantization, once per slot. Without a tensor-wide scale both run in one pass
    // over the slots (one phase barrier less: ~9 µs of a 0.8 ms decode layer with 2 threads).
    const bool need_max = c.rule2.kind == ActQuant::Fp8DynTensor;
    auto quantize2 = [&](int64_t pos, float sc2) {
      if (c.round2)
        for (float* v = z + pos * I; v < z + (pos + 1) * I; ++v) *v = bf16_round(*v);
      QuantRowArgs q{&c.rule2, &c.L2, sc2, z + pos * I, act2 + pos * c.L2.stride};
      kt.quantize_row(q);
    };
    const bool fused = !need_max && stage == Stage::Full;
    small_loop(P, static_cast<int64_t>(P) * I, [&](int64_t pos) {
      float* zr = z + pos * I;
      kt.activation_row(c.act, y1 + pos * R13, I, zr);
      if (need_max) s.zmax_of_pos[static_cast<size_t>(pos)] = kt.abs_max(zr, I);
      if (fused) quantize2(pos, scale2);
    });
    stamp(team);
    if (stage == Stage::MaxOnly) return;
    if (!fused) {
      float sc2 = scale2;
      if (need_max && sc2 < 0.0f) {
        float m = 0.0f;
        for (float v : s.zmax_of_pos) m = nan_max(m, v);
        sc2 = ref::act_tensor_scale(c.rule2, m);
      }
      small_loop(P, static_cast<int64_t>(P) * I, [&](int64_t pos) { quantize2(pos, sc2); });
    }
    stamp(team);
    // D: GEMM2 (+ bias, × router weight).
    gemm_phase(s.tasks2, *c.v2, c.L2, act2, s.pos_index.data(), y2, H,
               a.router_weight_on_input ? nullptr : s.rw_of_pos.data());
    stamp(team);
    // E: combine in k order.
    small_loop(nt, static_cast<int64_t>(nt) * K * H, [&](int64_t i) {
      float* o = a.out + static_cast<int64_t>(t0 + i) * H;
      const float* terms[64];
      thread_local std::vector<const float*> many;  // K > 64 only; grown only
      const float** tp = terms;
      if (K > 64) {
        many.resize(static_cast<size_t>(K));
        tp = many.data();
      }
      int n = 0;
      for (int k = 0; k < K; ++k) {
        const int pos = s.pos_of_slot[static_cast<size_t>(i * K + k)];
        if (pos >= 0) tp[n++] = y2 + static_cast<int64_t>(pos) * H;
      }
      if (n == 0) return;
      for (int h = 0; h < H; ++h) {
        float sum = tp[0][h];
        for (int j = 1; j < n; ++j) sum += tp[j][h];
        o[h] += sum;
      }
    });
    stamp(team);
  });
  if (profile && nstamps == 6)
    std::fprintf(stderr,
                 "qmoe cpu profile (%d tokens, %d slots, %d threads): A quant %.0f µs, B gemm1 %.0f, C1 act (+ quant) %.0f, "
                 "C2 quant (tensor scale) %.0f, D gemm2 %.0f, E combine %.0f\n",
                 nt, P, c.nthreads, stamps[0], stamps[1] - stamps[0], stamps[2] - stamps[1], stamps[3] - stamps[2],
                 stamps[4] - stamps[3], stamps[5] - stamps[4]);

  if (stage == Stage::MaxOnly) {
    float m = 0.0f;
    for (float v : s.zmax_of_pos) m = nan_max(m, v);
    return m;
  }
  return 0.0f;
}

}  // namespace

void experts_optimized_with(const ExpertsArgs& a, int threads, const OptimizedOptions& opt) {
  // The helper threads wake while this thread checks the arguments and plans (~12 µs at decode).
  ThreadPool::instance().prewake(threads);
  validate_args(a);
  const ExpertParams& p = *a.params;
  ref::validate_expert_params(p, "experts_optimized");
  check_experts_inputs(a, "experts_optimized");
  if (a.T == 0) return;
  for (int64_t q = 0; q < static_cast<int64_t>(a.T) * a.K; ++q) {
    const int32_t id = a.topk_ids[q];
    if (id < 0 || id >= p.num_experts)
      throw Error(fmt::format("experts_optimized: topk_ids[{}, {}] = {} is outside [0, {})", q / a.K, q % a.K, id,
                              p.num_experts));
  }
  if (p.num_local == 0) return;
  const Isa isa = opt.isa ? *opt.isa : default_isa();
  if (!isa_supported(isa))
    throw Error(fmt::format("experts_optimized: ISA {} is not supported by this CPU", isa_name(isa)));
  if (opt.chunk_tokens < 0) throw Error(fmt::format("experts_optimized: chunk_tokens = {} must be ≥ 0 (0: automatic)", opt.chunk_tokens));
  // Automatic chunks: the fp32 GEMM outputs, activations and quantized rows of a token's K slots
  // (≤ 4 + 2 · 3 bytes per intermediate element for the Bf16 kind's terms) within the budget. At
  // 256 tokens a 512-token prefill streamed (and, for the decoded formats, decoded) every weight twice.
  int chunk = opt.chunk_tokens;
  if (chunk == 0) {
    const int64_t per_token = static_cast<int64_t>(a.K) * (4LL * (2LL * p.inter + p.hidden) + 10LL * p.inter) + 16LL * p.hidden;
    chunk = static_cast<int>(std::clamp<int64_t>(kChunkScratchBytes / std::max<int64_t>(per_token, 1), 256, 1 << 20));
  }

  Call c;
  c.a = &a;
  c.p = &p;
  c.kt = &kernel_table(isa);
  c.nthreads = ThreadPool::resolve_threads(threads);
  c.H = p.hidden;
  c.I = p.inter;
  c.K = a.K;
  c.act = act_params_of(p.act);
  c.rule1 = ref::gemm1_act_rule(p);
  c.rule2 = ref::gemm2_act_rule(p);
  c.round1 = opt.bf16_activations && c.rule1.kind == ActQuant::None;
  c.round2 = opt.bf16_activations && c.rule2.kind == ActQuant::None;
  const DType ustore = p.w13_weight.dtype() == p.w2_weight.dtype() ? p.w13_weight.dtype() : DType::F32;
  const double tpe = static_cast<double>(std::min(a.T, chunk)) * a.K / p.num_local;
  c.L1 = make_act_layout(dot_kind_for(*p.scheme, isa, 1, ustore, tpe), p.scheme->weight, c.H);
  c.L2 = make_act_layout(dot_kind_for(*p.scheme, isa, 2, ustore, tpe), p.scheme->weight, c.I);
  Scratch& s = thread_scratch();
  s.v13.clear();
  s.v2.clear();
  for (int e = 0; e < p.num_local; ++e) {
    s.v13.push_back(make_view(p, ref::Proj::W13, e));
    s.v2.push_back(make_view(p, ref::Proj::W2, e));
  }
  c.v13 = &s.v13;
  c.v2 = &s.v2;
  if (c.rule1.kind == ActQuant::Fp8DynTensor) {
    float m = 0.0f;
    std::vector<float> tmp(static_cast<size_t>(c.H));
    for (int t = 0; t < a.T; ++t) {
      const float* x = a.x + static_cast<int64_t>(t) * c.H;
      if (a.router_weight_on_input) {
        for (int h = 0; h < c.H; ++h) tmp[static_cast<size_t>(h)] = x[h] * a.topk_weights[t];
        x = tmp.data();
      }
      m = nan_max(m, c.kt->abs_max(x, c.H));
    }
    c.scale1 = ref::act_tensor_scale(c.rule1, m);
  }

  float scale2 = -1.0f;
  if (c.rule2.kind == ActQuant::Fp8DynTensor && a.T > chunk) {
    float m = 0.0f;
    for (int t0 = 0; t0 < a.T; t0 += chunk) m = nan_max(m, run_chunk(c, s, t0, std::min(chunk, a.T - t0), Stage::MaxOnly, 0.0f));
    scale2 = ref::act_tensor_scale(c.rule2, m);
  }
  for (int t0 = 0; t0 < a.T; t0 += chunk) run_chunk(c, s, t0, std::min(chunk, a.T - t0), Stage::Full, scale2);
}

}  // namespace cpu

void experts_optimized(const ExpertsArgs& a, int threads) { cpu::experts_optimized_with(a, threads, {}); }

}  // namespace qmoe
