// The CPU runner of the benchmark face: one MoE layer's expert computation (GEMM1 + activation +
// GEMM2 + combine, activation quantization included; routing excluded) on random weights.
// Per point: median µs over ≥ reps repetitions (warm-up first; a fresh uniform routing, the next of
// the weight copies that rotate over ≥ 4 × the last-level cache (sysfs), and a 2 × LLC cache flush
// before each repetition), bytes of the experts the routing touched (+ fp32 x in, y out), GB/s,
// % of the read bandwidth measured by this command over the same span (same thread count) right
// before and right after the point's repetitions — the larger of the two.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>

#include "bench/bench.h"
#include "cpu/experts_optimized.h"
#include "cpu/isa.h"
#include "cpu/membw.h"
#include "cpu/random_params.h"
#include "cpu/thread_pool.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "qmoe/moe.h"

namespace qmoe::bench {

Report run_cpu(const Plan& plan) {
  const Options& o = plan.opt;
  const int threads = cpu::ThreadPool::resolve_threads(o.threads);
  const cpu::Isa isa = cpu::default_isa();
  // Sizes from the machine: weight copies rotate over ≥ 4 × LLC bytes, the caches are flushed
  // with 2 × LLC before each repetition, and the bandwidth probe reads the same span.
  const cpu::CacheInfo llc = cpu::last_level_cache();
  const double llc_b = static_cast<double>(llc.llc_bytes);
  fmt::print(stderr, "qmoe bench: {}, {} threads, ISA {}; LLC {:.1f} MiB ({})\n", cpu::cpu_model_name(), threads,
             cpu::isa_name(isa), llc_b / 1048576.0,
             llc.from_sysfs ? fmt::format("L{} from sysfs, {} instance(s)", llc.level, llc.instances)
                            : std::string("not in sysfs: assumed"));
  const size_t flush_bytes = std::max<size_t>(size_t{64} << 20, static_cast<size_t>(2 * llc.llc_bytes));

  Report rep;
  rep.device = "cpu";
  rep.kernel = o.kernel;
  rep.title = fmt::format("qmoe bench --device cpu ({} threads, {}, {} kernel)", threads, cpu::isa_name(isa), o.kernel);
  rep.header = fmt::format("device cpu: {} ({} threads, ISA {}, kernel {}), LLC {:.1f} MiB{}", cpu::cpu_model_name(),
                           threads, cpu::isa_name(isa), o.kernel, llc_b / 1048576.0, llc.from_sysfs ? "" : " (assumed)");
  rep.device_fields = {{"isa", std::string(cpu::isa_name(isa))},
                       {"threads", threads},
                       {"llc_bytes", llc.llc_bytes},
                       {"llc_from_sysfs", llc.from_sysfs},
                       {"cpu", cpu::cpu_model_name()}};

  for (const Shape* sh : plan.shapes) {
    const int E = o.experts > 0 ? o.experts : sh->E;
    for (const SchemeEntry& entry : plan.schemes) {
      const SchemeInfo* sc = entry.scheme;
      const double gb = E * estimated_expert_bytes(*sc, sh->H, sh->I) / 1e9;
      if (gb > plan.max_weight_gb)
        throw Error(fmt::format("{} with {} needs {:.1f} GB of expert weights for E = {} (limit {:.1f} GB, "
                                "--max-weight-gb); use --experts N to benchmark fewer experts",
                                sh->name, sc->name, gb, E, plan.max_weight_gb));
      fmt::print(stderr, "qmoe bench: {} {} (E={} K={} H={} I={}): generating {:.2f} GB of weights...\n", sh->name,
                 sc->name, E, sh->K, sh->H, sh->I, gb);
      cpu::RandomExpertsSpec spec;
      spec.scheme = sc;
      spec.num_experts = E;
      spec.hidden = sh->H;
      spec.inter = sh->I;
      spec.fast = true;
      spec.seed = o.seed;
      if (sh->gpt_oss) {
        spec.act.kind = Activation::SwigluOai;
        spec.act.interleaved = true;
        spec.act.limit = 7.0f;
        spec.bias = true;
      }
      std::vector<ExpertParams> copies;
      copies.push_back(cpu::make_random_expert_params(spec));
      const double ebytes = static_cast<double>(cpu::expert_weight_bytes(copies[0]));
      const double layer_bytes = ebytes * copies[0].num_local;
      const int ncopies = static_cast<int>(std::clamp(std::ceil(4.0 * llc_b / layer_bytes), 1.0,
                                                      std::max(1.0, std::floor(plan.max_weight_gb * 1e9 / layer_bytes))));
      for (int c = 1; c < ncopies; ++c) {
        spec.seed = o.seed + 1000003ull * static_cast<uint64_t>(c);
        copies.push_back(cpu::make_random_expert_params(spec));
      }
      const double working_set = layer_bytes * ncopies;
      const size_t probe_bytes = static_cast<size_t>(std::clamp(working_set, 4.0 * llc_b, 2.0 * (1ull << 30)));
      cpu::BandwidthResult bw = cpu::measure_read_bandwidth(threads, probe_bytes);
      fmt::print(stderr,
                 "qmoe bench:   working set {:.1f} MB ({} cop{} of {:.1f} MB; {:.1f} × LLC), read bandwidth over {:.0f} "
                 "MB: {:.1f} GB/s (median of {}; max {:.1f})\n",
                 working_set / 1e6, ncopies, ncopies == 1 ? "y" : "ies", layer_bytes / 1e6, working_set / llc_b,
                 static_cast<double>(bw.bytes) / 1e6, bw.median_gbps, bw.runs, bw.max_gbps);
      if (working_set < 4.0 * llc_b)
        fmt::print(stderr, "qmoe bench:   WARNING: working set below 4 × LLC (--max-weight-gb limits the copies); "
                           "figures may include cache hits\n");
      for (int T : plan.tokens) {
        std::mt19937_64 rng(o.seed * 7919 + static_cast<uint64_t>(T));
        std::normal_distribution<float> nd;
        std::vector<float> x(static_cast<size_t>(T) * sh->H), out(x.size());
        for (float& v : x) v = bf16_round(nd(rng));
        std::vector<int32_t> ids;
        std::vector<float> w;
        std::vector<double> us, touched, uniq;
        const int warm = o.kernel == "reference" ? 0 : 1;
        for (int r = 0; r < warm + o.reps; ++r) {
          random_routing(rng(), T, E, sh->K, ids, w);
          std::fill(out.begin(), out.end(), 0.0f);
          ExpertsArgs a;
          a.params = &copies[static_cast<size_t>(r) % copies.size()];
          a.x = x.data();
          a.T = T;
          a.K = sh->K;
          a.topk_ids = ids.data();
          a.topk_weights = w.data();
          a.out = out.data();
          cpu::flush_caches(flush_bytes);
          const auto t0 = std::chrono::steady_clock::now();
          if (o.kernel == "reference") experts_reference(a);
          else {
            cpu::OptimizedOptions oo;
            oo.bf16_activations = o.bf16_act || entry.bf16_act;
            cpu::experts_optimized_with(a, threads, oo);
          }
          const double dt = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
          if (r < warm) continue;
          std::set<int32_t> u(ids.begin(), ids.end());
          us.push_back(dt);
          uniq.push_back(static_cast<double>(u.size()));
          touched.push_back(static_cast<double>(u.size()) * ebytes + 2.0 * 4.0 * T * sh->H);
        }
        // The probe again right after the point's repetitions: on a shared machine the available
        // bandwidth drifts (±30 % within minutes on our VMs), so each point is held against the
        // larger of the probes that bracket it (the one before is the previous point's after).
        const cpu::BandwidthResult after = cpu::measure_read_bandwidth(threads, probe_bytes);
        const double bw_before = bw.median_gbps, bw_point = std::max(bw.median_gbps, after.median_gbps);
        bw = after;
        const Limits lim{bw_point * 1e9, o.peak_tflops * 1e12};
        std::vector<double> sorted = us;
        std::sort(sorted.begin(), sorted.end());
        Point p;
        p.shape = sh->name;
        p.scheme = entry.label;
        p.tokens = T;
        p.E = E;
        p.K = sh->K;
        p.H = sh->H;
        p.I = sh->I;
        p.reps = o.reps;
        p.median_us = sorted[sorted.size() / 2];
        p.min_us = sorted.front();
        double tb = 0, ue = 0;
        for (size_t i = 0; i < touched.size(); ++i) {
          tb += touched[i];
          ue += uniq[i];
        }
        p.touched_bytes = tb / static_cast<double>(touched.size());
        p.unique_experts = ue / static_cast<double>(uniq.size());
        p.flops = layer_flops(T, sh->K, sh->H, sh->I);
        p.gbps = p.touched_bytes / (p.median_us * 1e-6) / 1e9;
        p.tflops = p.flops / (p.median_us * 1e-6) / 1e12;
        p.bandwidth_gbps = bw_point;
        p.pct_of_bandwidth = 100.0 * p.gbps / bw_point;
        p.working_set_bytes = working_set;
        p.weight_copies = ncopies;
        p.floor = floors(p.touched_bytes, p.flops, lim);
        p.measured_mem_floor_us = p.touched_bytes / (bw_point * 1e9) * 1e6;
        fmt::print(stderr, "  T={:<5} {:>12.1f} µs  {:>7.2f} GB/s ({:5.1f}% of bw {:.1f}: probes {:.1f} before, {:.1f} after)  {:>8.1f} GFLOP/s\n",
                   T, p.median_us, p.gbps, p.pct_of_bandwidth, bw_point, bw_before, after.median_gbps, p.tflops * 1e3);
        if (p.pct_of_bandwidth > 100.0)
          fmt::print(stderr,
                     "  WARNING: T={} reads {:.1f}% of the measured bandwidth: more than memory can deliver, so part "
                     "of it came from cache (a benchmark bug) or the probe ran while the host was busier\n",
                     T, p.pct_of_bandwidth);
        rep.points.push_back(p);
      }
    }
  }
  return rep;
}

}  // namespace qmoe::bench
