// The CUDA runner of the benchmark face (the engine of `qmoe bench --device cuda` and bench_cuda):
// whole-layer expert timings on the GPU (align + input quantization + GEMM1 + activation and
// intermediate quantization + GEMM2 + combine), performance.md §7 method:
//  * random weights generated on the device, uniform random top-k routing (the same routing per
//    (shape, T) for every scheme and for the anchor);
//  * R copies of the weights rotated so that one graph replay touches ≥ max(256 MB, 4 × L2);
//  * one CUDA graph of R calls, median of the replays timed with CUDA events, divided by R;
//  * bytes = touched experts' stored bytes + 2·T·H·2 (bf16 x in, y out), FLOPs = 6·T·K·H·I;
//    floor = max(bytes / 4.3 TB/s, FLOPs / peak) (bench.h: h200_peak_flops);
//  * the read bandwidth of this card, measured once per command: a streaming read kernel over
//    ≥ 4 GiB, median of 9 runs;
//  * the in-run anchor: the same shape's two GEMMs in bf16 through cuBLAS (GEMM1 [n_e, H] × [H, 2I],
//    GEMM2 [n_e, I] × [I, H] for every touched expert e with its n_e tokens; no activation, no
//    routing, no combine), bf16 weights rotated the same way, timed the same way.
#include <cuda_runtime.h>
#if QMOE_BENCH_CUBLAS
#include <cublas_v2.h>
#endif
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/cuda/bench_kernels.h"
#include "cpu/membw.h"
#include "qmoe/cuda.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "qmoe/moe.h"

namespace qmoe::bench {

bool cuda_built_in() { return true; }

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(fmt::format("CUDA error in {}: {}", what, cudaGetErrorString(e)));
}
#define QB_CK(x) ck((x), #x)

// A device allocation freed on scope exit (exceptions included).
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  explicit DevBuf(size_t n) : bytes(n) { QB_CK(cudaMalloc(&p, n == 0 ? 16 : n)); }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    if (this != &o) {
      if (p) cudaFree(p);
      p = o.p;
      bytes = o.bytes;
      o.p = nullptr;
    }
    return *this;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// performance.md §10: vLLM Triton fused_moe on the H200 (side by side with qmoe 0ef2cf3, same
// scope: experts from given top-k), µs per layer: bf16, INT8 W8A8, FP8 W8A8.
const std::vector<int> kVllmTokens = {1, 16, 64, 256, 1024, 4096};
struct VllmRow {
  std::vector<double> bf16, int8, fp8;
};
const std::map<std::string, VllmRow>& vllm_table() {
  static const std::map<std::string, VllmRow> k = {
      {"mixtral-8x7b", {{177.5, 646.3, 655.6, 734.0, 1695.0, 5588.0}, {117.8, 344.4, 372.7, 1319.0, 3269.0, 10930.0},
                        {113.4, 348.0, 354.4, 414.9, 864.9, 2949.0}}},
      {"deepseek-v3", {{183.1, 2029.0, 4332.0, 5147.0, 6014.0, 9247.0}, {99.0, 1069.0, 2256.0, 4021.0, 6741.0, 9905.0},
                       {98.2, 1045.0, 2204.0, 2730.0, 4194.0, 6132.0}}},
      {"qwen3-30b-a3b", {{31.1, 189.6, 299.7, 331.1, 399.2, 882.5}, {28.0, 112.7, 179.9, 204.1, 671.8, 1624.0},
                         {25.2, 110.1, 170.0, 210.7, 374.6, 834.2}}},
      {"gpt-oss-120b", {{61.5, 582.6, 1299.0, 1500.0, 1780.0, 2706.0}, {42.6, 347.1, 742.2, 1181.0, 2017.0, 2970.0},
                        {41.7, 333.3, 727.7, 879.6, 1375.0, 1989.0}}},
  };
  return k;
}

struct Probe {
  double median_gbps = 0, max_gbps = 0;
  size_t bytes = 0;
  int runs = 0;
};

// The streaming read kernel over `gib` GiB (≥ 4), median of 9 timed runs after one warm-up.
Probe measure_read_bandwidth(double gib, cudaStream_t stream) {
  Probe pr;
  pr.bytes = static_cast<size_t>(gib * 1073741824.0) / 4096 * 4096;
  DevBuf buf(pr.bytes), sink(sizeof(unsigned));
  QB_CK(cudaMemsetAsync(buf.p, 0x5a, pr.bytes, stream));
  cudaEvent_t e0, e1;
  QB_CK(cudaEventCreate(&e0));
  QB_CK(cudaEventCreate(&e1));
  std::vector<double> gbps;
  for (int i = 0; i < 10; ++i) {
    QB_CK(cudaEventRecord(e0, stream));
    QB_CK(kernels::launch_read_stream(buf.p, pr.bytes, sink.as<unsigned>(), stream));
    QB_CK(cudaEventRecord(e1, stream));
    QB_CK(cudaEventSynchronize(e1));
    float ms = 0;
    QB_CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i > 0) gbps.push_back(static_cast<double>(pr.bytes) / (ms * 1e-3) / 1e9);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(gbps.begin(), gbps.end());
  pr.runs = static_cast<int>(gbps.size());
  pr.median_gbps = gbps[gbps.size() / 2];
  pr.max_gbps = gbps.back();
  return pr;
}

// Captures `calls` into one graph and times `reps` replays with events: sorted ms per replay.
// An eager warm-up runs first. With allow_eager, a failed capture falls back to timing eager
// calls (*graphed = false); otherwise it is an error.
std::vector<double> time_replays(const std::function<void()>& calls, int reps, cudaStream_t stream, bool allow_eager,
                                 bool* graphed) {
  calls();
  QB_CK(cudaStreamSynchronize(stream));
  QB_CK(cudaGetLastError());
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool ok = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  if (ok) {
    try {
      calls();
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      if (!allow_eager) throw;
      graph = nullptr;
      ok = false;
    }
  }
  if (ok) ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph != nullptr;
  if (ok) ok = cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  if (!ok) {
    const cudaError_t e = cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    if (!allow_eager) throw Error(fmt::format("CUDA graph capture of the benchmark failed: {}", cudaGetErrorString(e)));
    QB_CK(cudaStreamSynchronize(stream));
  }
  *graphed = ok;
  auto launch = [&] {
    if (ok) QB_CK(cudaGraphLaunch(exec, stream));
    else calls();
  };
  for (int i = 0; i < 3; ++i) launch();
  QB_CK(cudaStreamSynchronize(stream));
  cudaEvent_t e0, e1;
  QB_CK(cudaEventCreate(&e0));
  QB_CK(cudaEventCreate(&e1));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    QB_CK(cudaEventRecord(e0, stream));
    launch();
    QB_CK(cudaEventRecord(e1, stream));
    QB_CK(cudaEventSynchronize(e1));
    float t = 0;
    QB_CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  QB_CK(cudaGetLastError());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  std::sort(ms.begin(), ms.end());
  return ms;
}

#if QMOE_BENCH_CUBLAS
const char* cublas_status(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "alloc failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "arch mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
  }
}

// The cuBLAS bf16 anchor of one shape: all E experts' w13 [2I, H] and w2 [H, I] in bf16 (row-major,
// i.e. column-major [H, 2I] and [I, H] for cuBLAS), R copies, and activations for up to max_T·K rows.
class CublasAnchor {
 public:
  CublasAnchor(cublasHandle_t h, cudaStream_t s, int E, int K, int H, int I, int max_T, double max_bytes)
      : h_(h), s_(s), E_(E), K_(K), H_(H), I_(I) {
    const double expert = 3.0 * H * I * 2.0, all = expert * E;
    int R = static_cast<int>(std::ceil(256e6 / (expert * std::min(K, E))));
    R = std::max(1, std::min({R, 16, static_cast<int>(max_bytes / all)}));
    const size_t w13 = static_cast<size_t>(2) * I * H, w2 = static_cast<size_t>(H) * I;
    for (int r = 0; r < R; ++r) {
      w_.emplace_back(static_cast<size_t>(E) * (w13 + w2) * 2);
      QB_CK(kernels::launch_fill_bf16(w_.back().p, static_cast<size_t>(E) * (w13 + w2), 77 + r, s));
    }
    const size_t rows = static_cast<size_t>(max_T) * K;
    x_ = DevBuf(rows * H * 2);
    c1_ = DevBuf(rows * 2 * I * 2);
    a2_ = DevBuf(rows * I * 2);
    c2_ = DevBuf(rows * H * 2);
    QB_CK(kernels::launch_fill_bf16(x_.p, rows * H, 5, s));
    QB_CK(kernels::launch_fill_bf16(a2_.p, rows * I, 6, s));
    QB_CK(cudaStreamSynchronize(s));
  }
  int copies() const { return static_cast<int>(w_.size()); }
  double working_set() const { return 3.0 * H_ * I_ * 2.0 * E_ * copies(); }

  // µs per layer at this routing; sets *method the first time (grouped, else a loop of GemmEx).
  double time(const std::vector<int32_t>& ids, int reps, std::string* method) {
    // Tokens per expert, rows grouped by expert.
    std::vector<int> count(static_cast<size_t>(E_), 0);
    for (int32_t e : ids) ++count[static_cast<size_t>(e)];
    std::vector<int> experts, n, off;
    int o = 0;
    for (int e = 0; e < E_; ++e)
      if (count[static_cast<size_t>(e)] > 0) {
        experts.push_back(e);
        n.push_back(count[static_cast<size_t>(e)]);
        off.push_back(o);
        o += count[static_cast<size_t>(e)];
      }
    const int U = static_cast<int>(experts.size());
    const int R = copies();
    const size_t w13 = static_cast<size_t>(2) * I_ * H_, w2 = static_cast<size_t>(H_) * I_;
    // Host pointer tables [R][6][U]: A1, B1, C1, A2, B2, C2.
    std::vector<void*> ptr(static_cast<size_t>(R) * 6 * U);
    auto at = [&](int r, int j, int g) -> void*& { return ptr[(static_cast<size_t>(r) * 6 + j) * U + g]; };
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < U; ++g) {
        auto* base = static_cast<uint16_t*>(w_[static_cast<size_t>(r)].p);
        const auto e = static_cast<size_t>(experts[static_cast<size_t>(g)]);
        const auto row = static_cast<size_t>(off[static_cast<size_t>(g)]);
        at(r, 0, g) = base + e * w13;
        at(r, 1, g) = x_.as<uint16_t>() + row * H_;
        at(r, 2, g) = c1_.as<uint16_t>() + row * 2 * I_;
        at(r, 3, g) = base + static_cast<size_t>(E_) * w13 + e * w2;
        at(r, 4, g) = a2_.as<uint16_t>() + row * I_;
        at(r, 5, g) = c2_.as<uint16_t>() + row * H_;
      }
    DevBuf dptr(ptr.size() * sizeof(void*));
    QB_CK(cudaMemcpy(dptr.p, ptr.data(), ptr.size() * sizeof(void*), cudaMemcpyHostToDevice));
    const std::vector<cublasOperation_t> ta(static_cast<size_t>(U), CUBLAS_OP_T), tb(static_cast<size_t>(U), CUBLAS_OP_N);
    const std::vector<int> m1(static_cast<size_t>(U), 2 * I_), k1(static_cast<size_t>(U), H_), ld1(static_cast<size_t>(U), H_),
        ldc1(static_cast<size_t>(U), 2 * I_), m2(static_cast<size_t>(U), H_), k2(static_cast<size_t>(U), I_),
        ld2(static_cast<size_t>(U), I_), ldc2(static_cast<size_t>(U), H_), ones(static_cast<size_t>(U), 1);
    const std::vector<float> alpha(static_cast<size_t>(U), 1.0f), beta(static_cast<size_t>(U), 0.0f);
    void** d = dptr.as<void*>();
    auto dtab = [&](int r, int j) { return d + (static_cast<size_t>(r) * 6 + j) * U; };
    auto check = [](cublasStatus_t st, const char* what) {
      if (st != CUBLAS_STATUS_SUCCESS) throw Error(fmt::format("cuBLAS {}: {}", what, cublas_status(st)));
    };
    auto grouped = [&] {
      for (int r = 0; r < R; ++r) {
        check(cublasGemmGroupedBatchedEx(h_, ta.data(), tb.data(), m1.data(), n.data(), k1.data(), alpha.data(),
                                         const_cast<const void* const*>(dtab(r, 0)), CUDA_R_16BF, ld1.data(),
                                         const_cast<const void* const*>(dtab(r, 1)), CUDA_R_16BF, ld1.data(), beta.data(),
                                         dtab(r, 2), CUDA_R_16BF, ldc1.data(), U, ones.data(), CUBLAS_COMPUTE_32F),
              "cublasGemmGroupedBatchedEx (GEMM1)");
        check(cublasGemmGroupedBatchedEx(h_, ta.data(), tb.data(), m2.data(), n.data(), k2.data(), alpha.data(),
                                         const_cast<const void* const*>(dtab(r, 3)), CUDA_R_16BF, ld2.data(),
                                         const_cast<const void* const*>(dtab(r, 4)), CUDA_R_16BF, ld2.data(), beta.data(),
                                         dtab(r, 5), CUDA_R_16BF, ldc2.data(), U, ones.data(), CUBLAS_COMPUTE_32F),
              "cublasGemmGroupedBatchedEx (GEMM2)");
      }
    };
    auto looped = [&] {
      const float a = 1.0f, b = 0.0f;
      for (int r = 0; r < R; ++r)
        for (int g = 0; g < U; ++g) {
          check(cublasGemmEx(h_, CUBLAS_OP_T, CUBLAS_OP_N, 2 * I_, n[static_cast<size_t>(g)], H_, &a, at(r, 0, g),
                             CUDA_R_16BF, H_, at(r, 1, g), CUDA_R_16BF, H_, &b, at(r, 2, g), CUDA_R_16BF, 2 * I_,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "cublasGemmEx (GEMM1)");
          check(cublasGemmEx(h_, CUBLAS_OP_T, CUBLAS_OP_N, H_, n[static_cast<size_t>(g)], I_, &a, at(r, 3, g),
                             CUDA_R_16BF, I_, at(r, 4, g), CUDA_R_16BF, I_, &b, at(r, 5, g), CUDA_R_16BF, H_,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "cublasGemmEx (GEMM2)");
        }
    };
    if (use_grouped_ < 0) {
      // First use: the grouped API where this cuBLAS runs it, else the loop.
      try {
        grouped();
        QB_CK(cudaStreamSynchronize(s_));
        use_grouped_ = 1;
      } catch (const Error& e) {
        cudaGetLastError();
        fmt::print(stderr, "qmoe bench: cuBLAS grouped GEMM unavailable ({}); the anchor loops cublasGemmEx\n", e.what());
        use_grouped_ = 0;
      }
    }
    bool graphed = false;
    const std::vector<double> ms =
        use_grouped_ ? time_replays(grouped, reps, s_, true, &graphed) : time_replays(looped, reps, s_, true, &graphed);
    const std::string m = fmt::format(
        "{}: bf16 in and out, fp32 accumulate; per touched expert GEMM1 [n_e, H] x [H, 2I] and GEMM2 [n_e, I] x [I, H] "
        "(no activation, routing or combine); {} bf16 weight cop{}; {}",
        use_grouped_ ? "cublasGemmGroupedBatchedEx (one grouped call per GEMM)" : "cublasGemmEx per expert",
        R, R == 1 ? "y" : "ies", graphed ? "CUDA graph replays" : "eager calls (graph capture failed)");
    if (method->empty()) *method = m;
    else if (*method != m && method->find(" | ") == std::string::npos) *method += " | also: " + m;
    return ms[ms.size() / 2] * 1000.0 / R;
  }

 private:
  cublasHandle_t h_;
  cudaStream_t s_;
  int E_, K_, H_, I_;
  std::vector<DevBuf> w_;
  DevBuf x_, c1_, a2_, c2_;
  int use_grouped_ = -1;
};
#endif  // QMOE_BENCH_CUBLAS

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { QB_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};
#if QMOE_BENCH_CUBLAS
struct Cublas {
  cublasHandle_t h = nullptr;
  DevBuf ws;
  Cublas(cudaStream_t s) : ws(size_t{64} << 20) {
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw Error("cublasCreate failed");
    // cublasSetStream resets the workspace: set the stream first. A user workspace keeps cuBLAS
    // from allocating during graph capture.
    cublasSetStream(h, s);
    cublasSetWorkspace(h, ws.p, ws.bytes);
  }
  ~Cublas() { cublasDestroy(h); }
};
#endif

}  // namespace

Report run_cuda(const Plan& plan) {
  const Options& o = plan.opt;
  if (!qmoe::cuda::available())
    throw Error("--device cuda: no CUDA device is visible (qmoe is built with CUDA, but the driver reports none)");
  cudaDeviceProp prop{};
  QB_CK(cudaGetDeviceProperties(&prop, 0));
  Stream stream;
  const double l2 = static_cast<double>(prop.l2CacheSize);
  const double touch_goal = std::max(256e6, 4.0 * l2);
  fmt::print(stderr, "qmoe bench: {}; L2 {:.0f} MiB; measuring the read bandwidth over {:.1f} GiB...\n",
             qmoe::cuda::device_description(), l2 / 1048576.0, o.probe_gib);
  const Probe bw = measure_read_bandwidth(o.probe_gib, stream.s);
  fmt::print(stderr, "qmoe bench:   read bandwidth {:.0f} GB/s (median of {}; max {:.0f}) over {:.2f} GiB\n", bw.median_gbps,
             bw.runs, bw.max_gbps, static_cast<double>(bw.bytes) / 1073741824.0);
#if QMOE_BENCH_CUBLAS
  std::unique_ptr<Cublas> blas;
  if (o.anchor) blas = std::make_unique<Cublas>(stream.s);
#else
  if (o.anchor) fmt::print(stderr, "qmoe bench: WARNING: built without cuBLAS (CMake found no CUDA::cublas): no anchor\n");
#endif

  Report rep;
  rep.device = "cuda";
  rep.kernel = "optimized";
  rep.title = fmt::format("qmoe bench --device cuda ({})", qmoe::cuda::device_description());
  rep.header = fmt::format("device cuda: {}, L2 {:.0f} MiB, read bandwidth {:.0f} GB/s (streaming read of {:.1f} GiB, median)",
                           qmoe::cuda::device_description(), l2 / 1048576.0, bw.median_gbps,
                           static_cast<double>(bw.bytes) / 1073741824.0);
  rep.device_fields = {{"gpu", qmoe::cuda::device_description()},
                       {"l2_bytes", prop.l2CacheSize},
                       {"sms", prop.multiProcessorCount},
                       {"bandwidth_probe_bytes", bw.bytes},
                       {"bandwidth_max_gbps", bw.max_gbps},
                       {"bandwidth_runs", bw.runs},
                       {"floor_bandwidth_gbps", kH200BytesPerS / 1e9},
                       // The CPU runner's fields, so that a CUDA point carries every CPU key: the
                       // GPU's last-level cache is its L2; host threads and ISA do not apply.
                       {"llc_bytes", prop.l2CacheSize},
                       {"llc_from_sysfs", false},
                       {"cpu", cpu::cpu_model_name()},
                       {"threads", nullptr},
                       {"isa", nullptr}};
  const int max_T = plan.tokens.back();

  for (size_t si = 0; si < plan.shapes.size(); ++si) {
    const Shape& sh = *plan.shapes[si];
    const int E = o.experts > 0 ? o.experts : sh.E;
    // Inputs shared by all schemes of this shape.
    std::mt19937 rng(1234);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> hx(static_cast<size_t>(max_T) * sh.H);
    for (auto& v : hx) v = nd(rng);
    DevBuf dx(sizeof(float) * hx.size()), dout(sizeof(float) * hx.size()), dx16(sizeof(uint16_t) * hx.size());
    DevBuf dids(sizeof(int32_t) * max_T * sh.K), dw(sizeof(float) * max_T * sh.K);
    QB_CK(cudaMemcpy(dx.p, hx.data(), sizeof(float) * hx.size(), cudaMemcpyHostToDevice));
    {
      std::vector<uint16_t> h16(hx.size());
      for (size_t i = 0; i < hx.size(); ++i) h16[i] = bf16_encode(hx[i]);
      QB_CK(cudaMemcpy(dx16.p, h16.data(), sizeof(uint16_t) * h16.size(), cudaMemcpyHostToDevice));
    }
    // One uniform routing per T, shared by every scheme and the anchor.
    std::map<int, std::pair<std::vector<int32_t>, std::vector<float>>> routing;
    for (int T : plan.tokens)
      random_routing(o.seed * 7919 + 131 * si + static_cast<uint64_t>(T), T, E, sh.K, routing[T].first, routing[T].second);

    std::map<int, double> anchor_us;
#if QMOE_BENCH_CUBLAS
    if (blas) {
      try {
        fmt::print(stderr, "qmoe bench: {} cuBLAS bf16 anchor (E={} K={} H={} I={})...\n", sh.name, E, sh.K, sh.H, sh.I);
        CublasAnchor anchor(blas->h, stream.s, E, sh.K, sh.H, sh.I, max_T, plan.max_weight_gb * 1e9);
        for (int T : plan.tokens) {
          anchor_us[T] = anchor.time(routing[T].first, o.reps, &rep.anchor_method);
          fmt::print(stderr, "  T={:<5} cuBLAS bf16 {:10.1f} us\n", T, anchor_us[T]);
        }
      } catch (const std::exception& e) {
        cudaGetLastError();
        fmt::print(stderr, "qmoe bench: WARNING: cuBLAS anchor of {} skipped: {}\n", sh.name, e.what());
      }
    }
#endif

    for (const SchemeEntry& entry : plan.schemes) {
      const SchemeInfo& sc = *entry.scheme;
      qmoe::cuda::CudaOptions opt;
      opt.bf16_activations = o.bf16_act || entry.bf16_act;
      opt.token_tile = entry.token_tile ? entry.token_tile : o.token_tile;
      opt.ksplit = entry.ksplit;
      if (entry.no_wgmma) opt.wgmma = false;
      opt.fp8_mma = entry.fp8_mma;
      ActivationSpec act;  // SiLU, no biases (as the vLLM anchors were measured)
      qmoe::cuda::CudaExperts probe = qmoe::cuda::CudaExperts::random(sc, 1, sh.H, sh.I, act, 1, opt);
      const double eb = probe.expert_bytes();
      const double all = eb * E;
      const double touched1 = eb * std::min(sh.K, E);
      int R = static_cast<int>(std::ceil(touch_goal / std::min(all, touched1)));
      R = std::max(1, std::min({R, 16, static_cast<int>(plan.max_weight_gb * 1e9 / all)}));
      if (o.copies > 0) R = o.copies;
      std::vector<qmoe::cuda::CudaExperts> copies;
      for (int r = 0; r < R; ++r) copies.push_back(qmoe::cuda::CudaExperts::random(sc, E, sh.H, sh.I, act, 100 + r, opt));
      for (int T : plan.tokens) {
        std::vector<int32_t> ids = routing[T].first;
        std::vector<float> w = routing[T].second;
        // +route: the whole layer from router logits — the model's routing on the device
        // (route_device) in the same graph; ids and U from the host route() of the same logits.
        DevBuf dlogits, dbias;
        RoutingConfig rc;
        if (entry.route) {
          if (std::string(sh.name) == "deepseek-v3") {
            rc.scoring = ScoringFunc::Sigmoid;
            rc.n_group = 8;
            rc.topk_group = 4;
            rc.has_correction_bias = true;
            rc.routed_scaling_factor = 2.5f;
          } else if (sh.gpt_oss) {
            rc.topk_then_softmax = true;
          }
          std::vector<float> logits(static_cast<size_t>(T) * E), bias(static_cast<size_t>(E));
          for (auto& v : logits) v = nd(rng);
          for (auto& v : bias) v = 0.01f * nd(rng);
          route(rc, logits.data(), T, E, sh.K, rc.has_correction_bias ? bias.data() : nullptr, ids.data(), w.data());
          dlogits = DevBuf(sizeof(float) * logits.size());
          dbias = DevBuf(sizeof(float) * bias.size());
          QB_CK(cudaMemcpy(dlogits.p, logits.data(), sizeof(float) * logits.size(), cudaMemcpyHostToDevice));
          QB_CK(cudaMemcpy(dbias.p, bias.data(), sizeof(float) * bias.size(), cudaMemcpyHostToDevice));
        }
        const std::set<int32_t> uniq(ids.begin(), ids.end());
        QB_CK(cudaMemcpy(dids.p, ids.data(), sizeof(int32_t) * ids.size(), cudaMemcpyHostToDevice));
        QB_CK(cudaMemcpy(dw.p, w.data(), sizeof(float) * w.size(), cudaMemcpyHostToDevice));
        for (auto& c : copies) c.reserve(T, sh.K);
        auto layer = [&](const qmoe::cuda::CudaExperts& c) {
          if (entry.route)
            qmoe::cuda::route_device(rc, dlogits.p, DType::F32, T, E, sh.K, rc.has_correction_bias ? dbias.as<float>() : nullptr,
                                     dids.as<int32_t>(), dw.as<float>(), stream.s);
          if (entry.x_bf16)
            c.run_device(dx16.p, DType::BF16, T, sh.K, dids.as<int32_t>(), dw.as<float>(), dout.as<float>(), false, false,
                         stream.s);
          else
            c.run_device(dx.as<float>(), T, sh.K, dids.as<int32_t>(), dw.as<float>(), dout.as<float>(), false, false,
                         stream.s);
        };
        bool graphed = false;
        const std::vector<double> ms = time_replays(
            [&] {
              for (auto& c : copies) layer(c);
            },
            o.reps, stream.s, false, &graphed);
        Point p;
        p.shape = sh.name;
        p.scheme = entry.label;
        p.tokens = T;
        p.E = E;
        p.K = sh.K;
        p.H = sh.H;
        p.I = sh.I;
        p.reps = o.reps;
        p.median_us = ms[ms.size() / 2] * 1000.0 / R;
        p.min_us = ms.front() * 1000.0 / R;
        p.unique_experts = static_cast<double>(uniq.size());
        p.touched_bytes = p.unique_experts * eb + 2.0 * T * sh.H * 2;
        p.flops = layer_flops(T, sh.K, sh.H, sh.I);
        p.gbps = p.touched_bytes / (p.median_us * 1e-6) / 1e9;
        p.tflops = p.flops / (p.median_us * 1e-6) / 1e12;
        p.bandwidth_gbps = bw.median_gbps;
        p.pct_of_bandwidth = 100.0 * p.gbps / bw.median_gbps;
        p.working_set_bytes = all * R;
        p.weight_copies = R;
        p.floor = floors(p.touched_bytes, p.flops,
                         Limits{kH200BytesPerS, o.peak_tflops > 0 ? o.peak_tflops * 1e12 : h200_peak_flops(sc)});
        p.measured_mem_floor_us = p.touched_bytes / (bw.median_gbps * 1e9) * 1e6;
        if (const auto a = anchor_us.find(T); a != anchor_us.end()) p.cublas_bf16_us = a->second;
        const auto vi = std::find(kVllmTokens.begin(), kVllmTokens.end(), T);
        const auto v = vllm_table().find(sh.name);
        if (vi != kVllmTokens.end() && v != vllm_table().end() && E == sh.E) {
          const auto j = static_cast<size_t>(vi - kVllmTokens.begin());
          p.vllm_bf16_us = v->second.bf16[j];
          p.vllm_int8_us = v->second.int8[j];
          p.vllm_fp8_us = v->second.fp8[j];
        }
        fmt::print(stderr,
                   "{:<14} {:<32} T={:5} U={:3} R={:2} {:10.1f} us  {:7.0f} GB/s ({:5.1f}% of bw)  {:6.1f} TFLOP/s  floor "
                   "{:8.1f} us ({}) {:5.1f}%  cuBLAS bf16 {:8.1f} us\n",
                   p.shape, p.scheme, T, uniq.size(), R, p.median_us, p.gbps, p.pct_of_bandwidth, p.tflops, p.floor.floor_us,
                   p.floor.bound, 100.0 * p.floor.floor_us / p.median_us, p.cublas_bf16_us);
        rep.points.push_back(p);
      }
    }
  }
  return rep;
}

}  // namespace qmoe::bench
