// bench_cuda: whole-layer expert timings on the GPU (align + input quantization + GEMM1 + activation
// and intermediate quantization + GEMM2 + combine), spec/performance.md §7 method:
//  * random weights generated on the device, uniform random top-k routing;
//  * R copies of the weights rotated so that consecutive calls touch ≥ 256 MB (defeats the L2);
//  * one CUDA graph of R calls, median of the replays timed with CUDA events, divided by R;
//  * bytes = touched experts' stored bytes + 2·T·H·2 (bf16 x in, y out), FLOPs = 6·T·K·H·I;
//    floor = max(bytes / 4.3 TB/s, FLOPs / peak), peak 790 TFLOP/s (bf16 MMA: bf16, W4A16) or
//    1580 (8-bit MMA possible: INT8 / FP8 W8A8, W4A4 whose operands are exact in fp8).
// Prints a table last; --out writes CSV.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "qmoe/cuda.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "qmoe/moe.h"
#include "qmoe/schemes.h"

namespace {

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)

struct Shape {
  std::string name;
  int E, K, H, I;
};
const std::vector<Shape> kShapes = {
    {"mixtral-8x7b", 8, 2, 4096, 14336},
    {"deepseek-v3", 256, 8, 7168, 2048},
    {"qwen3-30b-a3b", 128, 8, 2048, 768},
    {"gpt-oss-120b", 128, 4, 2880, 2880},
};
// performance.md §10: vLLM Triton fused_moe on this H200 (side by side with qmoe 0ef2cf3, same
// scope: experts from given top-k), µs per layer: bf16, INT8 W8A8, FP8 W8A8 (per-channel weights,
// dynamic per-token activations).
const std::vector<int> kVllmTokens = {1, 16, 64, 256, 1024, 4096};
struct VllmRow {
  std::vector<double> bf16, int8, fp8;
};
const std::map<std::string, VllmRow> kVllm = {
    {"mixtral-8x7b", {{177.5, 646.3, 655.6, 734.0, 1695.0, 5588.0}, {117.8, 344.4, 372.7, 1319.0, 3269.0, 10930.0},
                      {113.4, 348.0, 354.4, 414.9, 864.9, 2949.0}}},
    {"deepseek-v3", {{183.1, 2029.0, 4332.0, 5147.0, 6014.0, 9247.0}, {99.0, 1069.0, 2256.0, 4021.0, 6741.0, 9905.0},
                     {98.2, 1045.0, 2204.0, 2730.0, 4194.0, 6132.0}}},
    {"qwen3-30b-a3b", {{31.1, 189.6, 299.7, 331.1, 399.2, 882.5}, {28.0, 112.7, 179.9, 204.1, 671.8, 1624.0},
                       {25.2, 110.1, 170.0, 210.7, 374.6, 834.2}}},
    {"gpt-oss-120b", {{61.5, 582.6, 1299.0, 1500.0, 1780.0, 2706.0}, {42.6, 347.1, 742.2, 1181.0, 2017.0, 2970.0},
                      {41.7, 333.3, 727.7, 879.6, 1375.0, 1989.0}}},
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string t;
  while (std::getline(ss, t, ','))
    if (!t.empty()) v.push_back(t);
  return v;
}

double peak_flops(const qmoe::SchemeInfo& s) {
  using qmoe::ActQuant;
  switch (s.act) {
    case ActQuant::None:
    case ActQuant::Mxfp6E2M3:
    case ActQuant::Mxfp6E3M2: return 790e12;
    default: return 1580e12;
  }
}

struct Row {
  std::string shape, scheme;
  int T = 0;
  int U = 0;
  double us = 0, gbs = 0, tflops = 0, floor_us = 0, pct = 0, vllm_bf16 = NAN, vllm_int8 = NAN, vllm_fp8 = NAN;
  char bound = 'M';
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> shapes = {"mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b", "gpt-oss-120b"};
  // "+bf16act": CudaOptions::bf16_activations (vLLM's bf16 activations for weight-only schemes).
  std::vector<std::string> schemes = {"w_mxfp4", "w_mxfp4+bf16act", "w_mxfp4_a_mxfp4", "nvfp4",
                                      "w_int8_channel_a_int8_dyn_token", "w_fp8_channel_a_fp8_dyn_token",
                                      "unquantized", "unquantized+bf16act"};
  std::vector<int> tokens = {1, 16, 64, 256, 1024, 4096};
  int reps = 20;
  int force_copies = 0;  // --copies N: weight copies per graph (0: enough for ≥ 256 MB)
  std::string out_csv;
  qmoe::cuda::CudaOptions base_opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value after %s\n", a.c_str());
        std::exit(1);
      }
      return argv[++i];
    };
    if (a == "--shapes") shapes = split(next());
    else if (a == "--schemes") schemes = split(next());
    else if (a == "--tokens") {
      tokens.clear();
      for (const auto& t : split(next())) tokens.push_back(std::stoi(t));
    } else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--out") out_csv = next();
    else if (a == "--copies") force_copies = std::stoi(next());
    else if (a == "--bf16-act") base_opt.bf16_activations = true;
    else if (a == "--token-tile") base_opt.token_tile = std::stoi(next());
    else if (a == "--help") {
      std::printf("bench_cuda [--shapes a,b] [--schemes x,y] [--tokens 1,16] [--reps N] [--copies R] [--out file.csv] [--bf16-act] [--token-tile 8|16|64|128]\n");
      return 0;
    } else {
      std::fprintf(stderr, "unknown argument %s (try --help)\n", a.c_str());
      return 1;
    }
  }
  if (!qmoe::cuda::available()) {
    std::fprintf(stderr, "bench_cuda: no CUDA device\n");
    return 1;
  }
  std::printf("device: %s\n", qmoe::cuda::device_description().c_str());
  std::sort(tokens.begin(), tokens.end());
  const int max_T = tokens.back();
  std::vector<Row> rows;
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  try {
    for (const auto& sname : shapes) {
      auto it = std::find_if(kShapes.begin(), kShapes.end(), [&](const Shape& s) { return s.name == sname; });
      if (it == kShapes.end()) throw qmoe::Error("unknown shape " + sname);
      const Shape sh = *it;
      // Inputs shared by all schemes of this shape.
      std::mt19937 rng(1234);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> hx(static_cast<size_t>(max_T) * sh.H);
      for (auto& v : hx) v = nd(rng);
      float *dx = nullptr, *dout = nullptr, *dw = nullptr;
      int32_t* dids = nullptr;
      CK(cudaMalloc(&dx, sizeof(float) * hx.size()));
      CK(cudaMalloc(&dout, sizeof(float) * hx.size()));
      CK(cudaMalloc(&dids, sizeof(int32_t) * max_T * sh.K));
      CK(cudaMalloc(&dw, sizeof(float) * max_T * sh.K));
      CK(cudaMemcpy(dx, hx.data(), sizeof(float) * hx.size(), cudaMemcpyHostToDevice));
      // The same hidden states in bf16, for the +xbf16 entries (engines hold activations in bf16).
      void* dx16 = nullptr;
      {
        std::vector<uint16_t> h16(hx.size());
        for (size_t i = 0; i < hx.size(); ++i) h16[i] = qmoe::bf16_encode(hx[i]);
        CK(cudaMalloc(&dx16, sizeof(uint16_t) * h16.size()));
        CK(cudaMemcpy(dx16, h16.data(), sizeof(uint16_t) * h16.size(), cudaMemcpyHostToDevice));
      }
      for (const auto& entry : schemes) {
        const size_t plus = entry.find('+');
        const std::string scname = entry.substr(0, plus);
        qmoe::cuda::CudaOptions opt = base_opt;
        // Suffixes: +bf16act, +tileN (CudaOptions::token_tile), +xbf16 (hidden states in bf16),
        // +route (device routing from logits in the timed graph), +nowg (128-token tiles on the
        // mma.sync kernel instead of wgmma), in any order.
        bool x_bf16 = false, with_route = false;
        for (size_t p = plus; p != std::string::npos;) {
          const size_t q = entry.find('+', p + 1);
          const std::string suf = entry.substr(p + 1, q == std::string::npos ? std::string::npos : q - p - 1);
          if (suf == "bf16act") opt.bf16_activations = true;
          else if (suf == "xbf16") x_bf16 = true;
          else if (suf == "route") with_route = true;
          else if (suf == "nowg") opt.wgmma = false;
          else if (suf.rfind("tile", 0) == 0) opt.token_tile = std::stoi(suf.substr(4));
          else throw qmoe::Error("unknown scheme suffix '" + suf + "' in " + entry);
          p = q;
        }
        const qmoe::SchemeInfo& sc = qmoe::scheme_by_name(scname);
        qmoe::ActivationSpec act;  // SiLU, no biases (as the vLLM anchors were measured)
        // Copies so that one graph replay touches ≥ 256 MB of distinct weights.
        qmoe::cuda::CudaExperts probe = qmoe::cuda::CudaExperts::random(sc, 1, sh.H, sh.I, act, 1, opt);
        const double eb = probe.expert_bytes();
        const double all = eb * sh.E;
        const double touched1 = eb * std::min(sh.K, sh.E);
        int R = static_cast<int>(std::ceil(256e6 / std::min(all, touched1)));
        R = std::max(1, std::min({R, 16, static_cast<int>(40e9 / all)}));
        if (force_copies > 0) R = force_copies;
        std::vector<qmoe::cuda::CudaExperts> copies;
        for (int r = 0; r < R; ++r)
          copies.push_back(qmoe::cuda::CudaExperts::random(sc, sh.E, sh.H, sh.I, act, 100 + r, opt));
        for (int T : tokens) {
          // Uniform random routing: K distinct experts per token, positive weights summing to 1.
          std::vector<int32_t> ids(static_cast<size_t>(T) * sh.K);
          std::vector<float> w(ids.size());
          std::vector<int> pool(static_cast<size_t>(sh.E));
          for (int e = 0; e < sh.E; ++e) pool[static_cast<size_t>(e)] = e;
          std::set<int> uniq;
          for (int t = 0; t < T; ++t) {
            for (int k = 0; k < sh.K; ++k) std::swap(pool[static_cast<size_t>(k)], pool[k + rng() % (sh.E - k)]);
            float sum = 0;
            for (int k = 0; k < sh.K; ++k) {
              ids[static_cast<size_t>(t) * sh.K + k] = pool[static_cast<size_t>(k)];
              uniq.insert(pool[static_cast<size_t>(k)]);
              sum += w[static_cast<size_t>(t) * sh.K + k] = 0.5f + static_cast<float>(rng() % 1000) / 1000.0f;
            }
            for (int k = 0; k < sh.K; ++k) w[static_cast<size_t>(t) * sh.K + k] /= sum;
          }
          // +route: the whole layer from router logits — the model's routing on the device
          // (route_device) in the same graph; ids and U from the host route() of the same logits.
          float* dlogits = nullptr;
          float* dbias = nullptr;
          qmoe::RoutingConfig rc;
          if (with_route) {
            if (sh.name == "deepseek-v3") {
              rc.scoring = qmoe::ScoringFunc::Sigmoid;
              rc.n_group = 8;
              rc.topk_group = 4;
              rc.has_correction_bias = true;
              rc.routed_scaling_factor = 2.5f;
            } else if (sh.name == "gpt-oss-120b") {
              rc.topk_then_softmax = true;
            }
            std::vector<float> logits(static_cast<size_t>(T) * sh.E), bias(static_cast<size_t>(sh.E));
            for (auto& v : logits) v = nd(rng);
            for (auto& v : bias) v = 0.01f * nd(rng);
            qmoe::route(rc, logits.data(), T, sh.E, sh.K, rc.has_correction_bias ? bias.data() : nullptr, ids.data(),
                        w.data());
            uniq.clear();
            uniq.insert(ids.begin(), ids.end());
            CK(cudaMalloc(&dlogits, sizeof(float) * logits.size()));
            CK(cudaMalloc(&dbias, sizeof(float) * bias.size()));
            CK(cudaMemcpy(dlogits, logits.data(), sizeof(float) * logits.size(), cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dbias, bias.data(), sizeof(float) * bias.size(), cudaMemcpyHostToDevice));
          }
          CK(cudaMemcpy(dids, ids.data(), sizeof(int32_t) * ids.size(), cudaMemcpyHostToDevice));
          CK(cudaMemcpy(dw, w.data(), sizeof(float) * w.size(), cudaMemcpyHostToDevice));
          for (auto& c : copies) c.reserve(T, sh.K);
          auto layer = [&](const qmoe::cuda::CudaExperts& c) {
            if (with_route)
              qmoe::cuda::route_device(rc, dlogits, qmoe::DType::F32, T, sh.E, sh.K, rc.has_correction_bias ? dbias : nullptr,
                                       dids, dw, stream);
            if (x_bf16) c.run_device(dx16, qmoe::DType::BF16, T, sh.K, dids, dw, dout, false, false, stream);
            else c.run_device(dx, T, sh.K, dids, dw, dout, false, false, stream);
          };
          // Eager warm-up (module load, attributes), then capture R calls in one graph.
          for (auto& c : copies) layer(c);
          CK(cudaStreamSynchronize(stream));
          CK(cudaGetLastError());
          cudaGraph_t graph;
          cudaGraphExec_t exec;
          CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
          for (auto& c : copies) layer(c);
          CK(cudaStreamEndCapture(stream, &graph));
          CK(cudaGraphInstantiate(&exec, graph, 0));
          for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, stream));
          CK(cudaStreamSynchronize(stream));
          cudaEvent_t e0, e1;
          CK(cudaEventCreate(&e0));
          CK(cudaEventCreate(&e1));
          std::vector<float> ms;
          for (int i = 0; i < reps; ++i) {
            CK(cudaEventRecord(e0, stream));
            CK(cudaGraphLaunch(exec, stream));
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float t = 0;
            CK(cudaEventElapsedTime(&t, e0, e1));
            ms.push_back(t);
          }
          CK(cudaGetLastError());
          CK(cudaEventDestroy(e0));
          CK(cudaEventDestroy(e1));
          CK(cudaGraphExecDestroy(exec));
          CK(cudaGraphDestroy(graph));
          if (dlogits) CK(cudaFree(dlogits));
          if (dbias) CK(cudaFree(dbias));
          std::sort(ms.begin(), ms.end());
          Row r;
          r.shape = sh.name;
          r.scheme = entry;
          r.T = T;
          r.U = static_cast<int>(uniq.size());
          r.us = ms[ms.size() / 2] * 1000.0 / R;
          const double bytes = r.U * eb + 2.0 * T * sh.H * 2;
          const double flops = 6.0 * T * sh.K * static_cast<double>(sh.H) * sh.I;
          const double tm = bytes / 4.3e12, tc = flops / peak_flops(sc);
          r.floor_us = std::max(tm, tc) * 1e6;
          r.bound = tm >= tc ? 'M' : 'C';
          r.gbs = bytes / (r.us * 1e-6) / 1e9;
          r.tflops = flops / (r.us * 1e-6) / 1e12;
          r.pct = 100.0 * r.floor_us / r.us;
          const auto vi = std::find(kVllmTokens.begin(), kVllmTokens.end(), T);
          if (vi != kVllmTokens.end()) {
            const auto& v = kVllm.at(sh.name);
            const auto j = static_cast<size_t>(vi - kVllmTokens.begin());
            r.vllm_bf16 = v.bf16[j];
            r.vllm_int8 = v.int8[j];
            r.vllm_fp8 = v.fp8[j];
          }
          rows.push_back(r);
          std::printf("%-14s %-32s T=%5d U=%3d R=%2d %10.1f us  %7.0f GB/s  %6.1f TFLOP/s  floor %8.1f us (%c) %5.1f%%\n",
                      r.shape.c_str(), r.scheme.c_str(), T, r.U, R, r.us, r.gbs, r.tflops, r.floor_us, r.bound, r.pct);
          std::fflush(stdout);
        }
      }
      CK(cudaFree(dx));
      CK(cudaFree(dx16));
      CK(cudaFree(dout));
      CK(cudaFree(dids));
      CK(cudaFree(dw));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
  if (!out_csv.empty()) {
    std::ofstream f(out_csv);
    f << "shape,scheme,T,U,us,GBps,TFLOPps,floor_us,bound,pct_floor,vllm_bf16_us,vllm_int8_us,vllm_fp8_us\n";
    for (const auto& r : rows)
      f << fmt::format("{},{},{},{},{:.2f},{:.1f},{:.2f},{:.2f},{},{:.1f},{},{},{}\n", r.shape, r.scheme, r.T, r.U, r.us,
                       r.gbs, r.tflops, r.floor_us, r.bound, r.pct, r.vllm_bf16, r.vllm_int8, r.vllm_fp8);
  }
  // The short table, last: one row per (shape, scheme), µs and % of the floor per token count,
  // with vLLM's §9 figures under each shape.
  std::vector<std::pair<std::string, std::string>> keys;
  for (const auto& r : rows)
    if (std::find(keys.begin(), keys.end(), std::make_pair(r.shape, r.scheme)) == keys.end())
      keys.emplace_back(r.shape, r.scheme);
  std::printf("\n| shape | scheme |");
  for (int T : tokens) std::printf(" T=%d |", T);
  std::printf("\n|---|---|");
  for (size_t i = 0; i < tokens.size(); ++i) std::printf("---:|");
  std::printf("\n");
  std::string last_shape;
  auto vllm_rows = [&](const std::string& shape) {
    const auto v = kVllm.find(shape);
    if (v == kVllm.end()) return;
    static const char* kNames[3] = {"bf16", "INT8 W8A8", "FP8 W8A8"};
    for (int which = 0; which < 3; ++which) {
      std::printf("| %s | *vLLM %s (perf §10)* |", shape.c_str(), kNames[which]);
      for (int T : tokens) {
        const auto vi = std::find(kVllmTokens.begin(), kVllmTokens.end(), T);
        if (vi == kVllmTokens.end()) std::printf(" - |");
        else {
          const auto& col = which == 0 ? v->second.bf16 : which == 1 ? v->second.int8 : v->second.fp8;
          std::printf(" *%.0f* |", col[static_cast<size_t>(vi - kVllmTokens.begin())]);
        }
      }
      std::printf("\n");
    }
  };
  for (const auto& [shape, scheme] : keys) {
    if (!last_shape.empty() && shape != last_shape) vllm_rows(last_shape);
    last_shape = shape;
    std::printf("| %s | %s |", shape.c_str(), scheme.c_str());
    for (int T : tokens) {
      const auto it = std::find_if(rows.begin(), rows.end(),
                                   [&](const Row& r) { return r.shape == shape && r.scheme == scheme && r.T == T; });
      if (it == rows.end()) std::printf(" - |");
      else std::printf(" %.0f (%.0f%%) |", it->us, it->pct);
    }
    std::printf("\n");
  }
  if (!last_shape.empty()) vllm_rows(last_shape);
  std::printf("(µs per layer, %% of the performance.md §4 floor; full figures: --out CSV)\n");
  return 0;
}
