// `qmoe bench --device cuda --ep N --tp M`: one MoE layer spread over the GPUs of this node
// (qmoe/cuda_dist.h over NCCL), against
// the same tokens on one GPU and against the all-gather baseline, with the all-to-all bandwidth of
// the same communicators measured in the same run.
//  * ep × tp ranks, rank w = e·tp + t on GPU w, one thread each; random device weights per rank
//    (CudaExperts::random with the rank's EP expert map and TP slice), uniform random top-k;
//  * T tokens per EP rank (TP ranks of one EP rank share them); a rep is a host barrier, then every
//    rank's forward_device timed with CUDA events; the layer time of a rep is the slowest rank's;
//    median over the reps (the dispatch synchronises each rank once per call, as in serving);
//  * single GPU: CudaExperts with all experts at full I on GPU 0, run_device on ep·T tokens;
//    scaling efficiency = t_single / (ranks · t_layer) (1 = perfect);
//  * all-to-all bandwidth: 64 MiB to every peer through all_to_all_v, bytes sent off-GPU / time.
// NCCL_NVLS_ENABLE=0 is set here (NVLink multicast stays off). Prints a table; csv_path writes CSV.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "qmoe/cuda.h"
#include "qmoe/cuda_dist.h"
#include "qmoe/dist.h"
#include "qmoe/error.h"
#include "qmoe/params.h"
#include "qmoe/schemes.h"

namespace qmoe::bench {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

// Random top-k (distinct experts), weights 1/K, and random fp32 hidden states, on `device`.
struct Inputs {
  float* x = nullptr;
  int32_t* ids = nullptr;
  float* w = nullptr;
  float* out = nullptr;
  void alloc(int device, int T, const Shape& s, uint64_t seed) {
    check(cudaSetDevice(device), "cudaSetDevice");
    const size_t n = static_cast<size_t>(std::max(T, 1));
    std::mt19937_64 rng(seed);
    std::vector<float> hx(n * s.H);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float& v : hx) v = nd(rng);
    std::vector<int32_t> hid(n * s.K);
    std::vector<float> hw(n * s.K, 1.0f / static_cast<float>(s.K));
    std::vector<int> perm(static_cast<size_t>(s.E));
    for (size_t t = 0; t < n; ++t) {
      for (int e = 0; e < s.E; ++e) perm[static_cast<size_t>(e)] = e;
      for (int k = 0; k < s.K; ++k) {
        std::uniform_int_distribution<int> u(k, s.E - 1);
        std::swap(perm[static_cast<size_t>(k)], perm[static_cast<size_t>(u(rng))]);
        hid[t * s.K + k] = perm[static_cast<size_t>(k)];
      }
    }
    check(cudaMalloc(&x, hx.size() * 4), "cudaMalloc");
    check(cudaMalloc(&ids, hid.size() * 4), "cudaMalloc");
    check(cudaMalloc(&w, hw.size() * 4), "cudaMalloc");
    check(cudaMalloc(&out, hx.size() * 4), "cudaMalloc");
    check(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice), "upload");
    check(cudaMemcpy(ids, hid.data(), hid.size() * 4, cudaMemcpyHostToDevice), "upload");
    check(cudaMemcpy(w, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice), "upload");
  }
  void release() {
    cudaFree(x);
    cudaFree(ids);
    cudaFree(w);
    cudaFree(out);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Row {
  std::string shape, scheme, layout, dispatch;
  int T = 0;
  double us = 0, single_us = 0, eff = 0, mb_sent = 0;
};

}  // namespace

void run_distributed(const Plan& plan, const std::string& out_path) {
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  const int ep = plan.opt.ep, tp = plan.opt.tp, reps = plan.opt.reps;
  const std::vector<int>& tokens = plan.tokens;
  {
    if (!cuda::nccl_available()) throw Error("--ep / --tp: this qmoe was built without NCCL");
    const int gpus = cuda::device_count();
    const int world = ep * tp;
    if (world > gpus)
      throw Error(fmt::format("--ep {} x --tp {} = {} ranks, but {} GPUs are visible", ep, tp, world, gpus));
    std::printf("qmoe bench (distributed): %d of %d GPUs (%s), ep %d x tp %d, %d reps\n", world, gpus,
                cuda::device_description(0).c_str(), ep, tp, reps);
    const dist::RankLayout lay{ep, tp};
    std::vector<std::vector<std::unique_ptr<dist::Communicator>>> ep_groups(static_cast<size_t>(tp)),
        tp_groups(static_cast<size_t>(ep));
    for (int t = 0; t < tp; ++t) ep_groups[static_cast<size_t>(t)] = cuda::nccl_communicators(lay.ep_group(t));
    for (int e = 0; e < ep; ++e) tp_groups[static_cast<size_t>(e)] = cuda::nccl_communicators(lay.tp_group(e * tp));
    auto ep_of = [&](int w) -> dist::Communicator& {
      return *ep_groups[static_cast<size_t>(lay.tp_rank(w))][static_cast<size_t>(lay.ep_rank(w))];
    };
    auto tp_of = [&](int w) -> dist::Communicator& {
      return *tp_groups[static_cast<size_t>(lay.ep_rank(w))][static_cast<size_t>(lay.tp_rank(w))];
    };

    // All-to-all bandwidth of the EP group of TP rank 0.
    double a2a_gbps = 0;
    if (ep > 1) {
      const size_t per = size_t{64} << 20;
      std::vector<double> secs(static_cast<size_t>(ep));
      std::barrier sync(ep);
      std::vector<std::thread> th;
      for (int e = 0; e < ep; ++e)
        th.emplace_back([&, e] {
          const int w = e * tp;
          check(cudaSetDevice(w), "cudaSetDevice");
          void *s = nullptr, *r = nullptr;
          check(cudaMalloc(&s, per * ep), "cudaMalloc");
          check(cudaMalloc(&r, per * ep), "cudaMalloc");
          std::vector<size_t> off(static_cast<size_t>(ep)), bytes(static_cast<size_t>(ep), per);
          for (int p = 0; p < ep; ++p) off[static_cast<size_t>(p)] = per * static_cast<size_t>(p);
          std::vector<double> t;
          for (int i = 0; i < 6; ++i) {
            sync.arrive_and_wait();
            const auto t0 = std::chrono::steady_clock::now();
            ep_of(w).all_to_all_v(s, off.data(), bytes.data(), r, off.data(), bytes.data(), nullptr);
            check(cudaDeviceSynchronize(), "sync");
            t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          }
          secs[static_cast<size_t>(e)] = median(t);
          cudaFree(s);
          cudaFree(r);
        });
      for (auto& t : th) t.join();
      a2a_gbps = static_cast<double>(per) * (ep - 1) / *std::max_element(secs.begin(), secs.end()) / 1e9;
      std::printf("all-to-all over NCCL: %.1f GB/s sent off-GPU per GPU (64 MiB to each of %d peers)\n", a2a_gbps,
                  ep - 1);
    }

    std::vector<Row> rows;
    for (const SchemeEntry& entry : plan.schemes) {
      if (entry.has_suffix())
        throw Error(fmt::format("--ep / --tp: scheme entry '{}': the CUDA variant suffixes are not supported here",
                                entry.label));
      const SchemeInfo& scheme = *entry.scheme;
      for (const Shape* shp : plan.shapes) {
        const Shape& sh = *shp;
        if (sh.I % tp != 0 || (sh.I / tp) % 64 != 0)
          throw Error(fmt::format("--tp {}: {}: I = {} does not split into slices of a multiple of 64", tp, sh.name,
                                  sh.I));
        ActivationSpec act;
        // Single-GPU reference: all experts at full I on GPU 0.
        std::vector<double> single_us(tokens.size());
        {
          check(cudaSetDevice(0), "cudaSetDevice");
          cuda::CudaExperts solo = cuda::CudaExperts::random(scheme, sh.E, sh.H, sh.I, act, 7);
          for (size_t ti = 0; ti < tokens.size(); ++ti) {
            const int T = tokens[ti] * ep;
            solo.reserve(T, sh.K);
            Inputs in;
            in.alloc(0, T, sh, 99);
            cudaEvent_t a, b;
            cudaEventCreate(&a);
            cudaEventCreate(&b);
            std::vector<double> t;
            for (int r = 0; r < reps + 2; ++r) {
              cudaEventRecord(a);
              solo.run_device(in.x, T, sh.K, in.ids, in.w, in.out, false, false, nullptr);
              cudaEventRecord(b);
              check(cudaEventSynchronize(b), "sync");
              float ms = 0;
              cudaEventElapsedTime(&ms, a, b);
              if (r >= 2) t.push_back(ms * 1e3);
            }
            single_us[ti] = median(t);
            in.release();
          }
        }
        for (const dist::ExpertDispatch mode : {dist::ExpertDispatch::AllToAll, dist::ExpertDispatch::AllGather}) {
          if (ep == 1 && mode == dist::ExpertDispatch::AllGather) continue;
          const dist::DistOptions o{ep, tp, mode};
          std::vector<std::vector<double>> per_rank(static_cast<size_t>(world));
          std::vector<double> sent(static_cast<size_t>(world));
          std::vector<std::string> errors(static_cast<size_t>(world));
          std::barrier sync(world);
          std::vector<std::thread> th;
          for (int w = 0; w < world; ++w)
            th.emplace_back([&, w] {
              try {
                check(cudaSetDevice(w), "cudaSetDevice");
                cuda::CudaOptions copt;
                copt.device = w;
                cuda::CudaExperts ex = cuda::CudaExperts::random(scheme, sh.E, sh.H, sh.I / tp, act, 7 + w, copt,
                                                     ep_expert_map(sh.E, lay.ep_rank(w), ep));
                cuda::CudaDistributedMoE layer(std::move(ex), sh.K, false, ep_of(w), tp_of(w), o, w);
                cudaEvent_t a, b;
                cudaEventCreate(&a);
                cudaEventCreate(&b);
                for (size_t ti = 0; ti < tokens.size(); ++ti) {
                  const int T = tokens[ti];
                  Inputs in;
                  in.alloc(w, T, sh, 1000 + static_cast<uint64_t>(lay.ep_rank(w)));
                  std::vector<double> t;
                  for (int r = 0; r < reps + 2; ++r) {
                    sync.arrive_and_wait();
                    cudaEventRecord(a);
                    layer.forward_device(in.x, DType::F32, T, in.ids, in.w, in.out, nullptr);
                    cudaEventRecord(b);
                    check(cudaEventSynchronize(b), "sync");
                    float ms = 0;
                    cudaEventElapsedTime(&ms, a, b);
                    if (r >= 2) t.push_back(ms * 1e3);
                  }
                  per_rank[static_cast<size_t>(w)].insert(per_rank[static_cast<size_t>(w)].end(), t.begin(), t.end());
                  sent[static_cast<size_t>(w)] = static_cast<double>(layer.last_bytes_sent());
                  in.release();
                  // Record this T's median per rank, then move on.
                  sync.arrive_and_wait();
                  if (w == 0) {
                    Row row;
                    row.shape = sh.name;
                    row.scheme = entry.label;
                    row.layout = fmt::format("ep{}xtp{}", ep, tp);
                    row.dispatch = mode == dist::ExpertDispatch::AllToAll ? "all-to-all" : "all-gather";
                    row.T = T;
                    // Slowest rank per rep, then the median over reps.
                    std::vector<double> slow(static_cast<size_t>(reps), 0.0);
                    for (int q = 0; q < world; ++q) {
                      const auto& v = per_rank[static_cast<size_t>(q)];
                      for (int r = 0; r < reps; ++r)
                        slow[static_cast<size_t>(r)] =
                            std::max(slow[static_cast<size_t>(r)], v[v.size() - static_cast<size_t>(reps) + r]);
                    }
                    row.us = median(slow);
                    row.single_us = single_us[ti];
                    row.eff = row.single_us / (world * row.us);
                    row.mb_sent = sent[0] / 1e6;
                    rows.push_back(row);
                  }
                  sync.arrive_and_wait();
                }
              } catch (const std::exception& e) {
                errors[static_cast<size_t>(w)] = e.what();
              }
            });
          for (auto& t : th) t.join();
          for (const std::string& e : errors)
            if (!e.empty()) throw Error(e);
        }
      }
    }
    std::printf(
        "\n| shape | scheme | layout | dispatch | T per EP rank | layer us | 1 GPU us (ep*T tokens) | efficiency | "
        "MB sent by rank 0 |\n|---|---|---|---|---:|---:|---:|---:|---:|\n");
    for (const Row& r : rows)
      std::printf("| %s | %s | %s | %s | %d | %.1f | %.1f | %.2f | %.2f |\n", r.shape.c_str(), r.scheme.c_str(),
                  r.layout.c_str(), r.dispatch.c_str(), r.T, r.us, r.single_us, r.eff, r.mb_sent);
    if (!out_path.empty()) {
      std::ofstream f(out_path);
      f << "shape,scheme,layout,dispatch,T,us,single_us,efficiency,mb_sent,a2a_gbps\n";
      for (const Row& r : rows)
        f << r.shape << ',' << r.scheme << ',' << r.layout << ',' << r.dispatch << ',' << r.T << ',' << r.us << ','
          << r.single_us << ',' << r.eff << ',' << r.mb_sent << ',' << a2a_gbps << '\n';
    }
  }
}

}  // namespace qmoe::bench
