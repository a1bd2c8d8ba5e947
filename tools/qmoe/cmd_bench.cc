// qmoe bench — time one MoE layer's expert computation (GEMM1 + activation + GEMM2 + combine,
// activation quantization included; routing excluded) on random weights of a standard shape.
// Per point: median µs over ≥ 5 repetitions (warm-up first; a fresh uniform routing, the next of
// the weight copies that rotate over ≥ 4 × the last-level cache (sysfs), and a 2 × LLC cache
// flush before each repetition), bytes of the experts the routing touched, GB/s, % of the read
// bandwidth measured by this command over the same span (same thread count), GFLOP/s
// (6·T·K·H·I). A point above 100% of that bandwidth is flagged: it cannot come from memory.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "commands.h"
#include "cpu/experts_optimized.h"
#include "cpu/isa.h"
#include "cpu/membw.h"
#include "cpu/random_params.h"
#include "cpu/thread_pool.h"
#include "util/files.h"
#include "qmoe/error.h"
#include "qmoe/formats.h"
#include "qmoe/moe.h"
#include "qmoe/schemes.h"

namespace qmoe::cli {

namespace {

struct BenchShape {
  const char* name;
  int E, K, H, I;
  bool gpt_oss;  // swigluoai (interleaved gate/up, alpha 1.702, limit 7) with biases
};

// performance.md §3–4, plus two small shapes for quick runs.
constexpr BenchShape kShapes[] = {
    {"mixtral-8x7b", 8, 2, 4096, 14336, false},   {"deepseek-v3", 256, 8, 7168, 2048, false},
    {"qwen3-30b-a3b", 128, 8, 2048, 768, false},  {"gpt-oss-120b", 128, 4, 2880, 2880, true},
    {"gpt-oss-20b", 32, 4, 2880, 2880, true},     {"tiny", 8, 2, 512, 256, false},
    {"small", 16, 4, 1024, 512, false},
};

const BenchShape& shape_by_name(const std::string& n) {
  for (const auto& s : kShapes)
    if (n == s.name) return s;
  std::string known;
  for (const auto& s : kShapes) known += (known.empty() ? "" : ", ") + std::string(s.name);
  throw Error(fmt::format("unknown --shape '{}'; known shapes: {}", n, known));
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = s.find(',', b);
    const std::string item = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (!item.empty()) out.push_back(item);
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return out;
}

// Bytes of one expert as stored (weights + block / channel scales).
double expert_bytes(const SchemeInfo& s, int H, int I) {
  const double n = 3.0 * H * I;
  switch (s.weight) {
    case WeightFormat::BF16: return n * 2.0;
    case WeightFormat::Fp8E4M3:
    case WeightFormat::Int8: return n + (s.weight_scale == WeightScale::PerChannel ? 4.0 * (2.0 * I + H) : 8.0);
    default: return n * s.bits_per_weight / 8.0;
  }
}

struct Point {
  std::string shape, scheme;
  int tokens = 0, threads = 0, E = 0, K = 0, H = 0, I = 0;
  double median_us = 0, min_us = 0, touched_bytes = 0, unique_experts = 0, gbps = 0, pct = 0, tflops = 0;
  double bw_gbps = 0, working_set = 0;  // bandwidth probe of this (shape, scheme); weight copies × layer bytes
  int copies = 1;
};

struct Options {
  std::string device = "cpu";
  std::string shapes = "qwen3-30b-a3b";
  std::string schemes = "w_mxfp4_a_mxfp4";
  std::string tokens = "1,16,128";
  int threads = 0;
  bool json = false;
  std::string plot;
  std::string kernel = "optimized";
  int reps = 5;
  int experts = 0;
  double max_weight_gb = 8.0;
  uint64_t seed = 1;
};

// Uniform routing: K distinct experts per token, weights normalised.
void random_routing(std::mt19937_64& rng, int T, int E, int K, std::vector<int32_t>& ids, std::vector<float>& w) {
  ids.resize(static_cast<size_t>(T) * K);
  w.resize(ids.size());
  std::uniform_int_distribution<int> pick(0, E - 1);
  std::uniform_real_distribution<float> u(0.1f, 1.0f);
  for (int t = 0; t < T; ++t) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) {
      int e;
      bool dup;
      do {
        e = pick(rng);
        dup = false;
        for (int j = 0; j < k; ++j) dup = dup || ids[static_cast<size_t>(t) * K + j] == e;
      } while (dup);
      ids[static_cast<size_t>(t) * K + k] = e;
      sum += w[static_cast<size_t>(t) * K + k] = u(rng);
    }
    for (int k = 0; k < K; ++k) w[static_cast<size_t>(t) * K + k] /= sum;
  }
}

std::string svg_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}

// Two panels (µs per layer on log-y, % of measured bandwidth), log-x tokens, one line per
// (shape, scheme), legend below.
void write_svg(const std::string& path, const std::vector<Point>& pts, double bw_gbps, const std::string& title) {
  std::map<std::string, std::vector<const Point*>> series;
  std::set<int> tok_set;
  for (const auto& p : pts) {
    series[p.shape + " / " + p.scheme].push_back(&p);
    tok_set.insert(p.tokens);
  }
  if (pts.empty()) throw Error("--plot: no points to plot");
  const double W = 1000, PW = 420, PH = 300, L = 70, T0 = 50;
  const double panel_x[2] = {L, L + PW + 90};
  const double tmin = *tok_set.begin(), tmax = std::max<double>(*tok_set.rbegin(), tok_set.size() == 1 ? tmin * 2 : 0.0);
  double umin = 1e300, umax = 0, pmax = 100;
  for (const auto& p : pts) {
    umin = std::min(umin, p.median_us);
    umax = std::max(umax, p.median_us);
    pmax = std::max(pmax, p.pct);
  }
  const double ly0 = std::floor(std::log10(umin)), ly1 = std::max(ly0 + 1, std::ceil(std::log10(umax)));
  pmax = std::ceil(pmax / 20.0) * 20.0;
  auto xpos = [&](int panel, double t) {
    const double f = tmax > tmin ? (std::log(t) - std::log(tmin)) / (std::log(tmax) - std::log(tmin)) : 0.5;
    return panel_x[panel] + f * PW;
  };
  auto y_us = [&](double us) { return T0 + PH - (std::log10(us) - ly0) / (ly1 - ly0) * PH; };
  auto y_pct = [&](double p) { return T0 + PH - p / pmax * PH; };
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
  const double H = T0 + PH + 70 + 18.0 * static_cast<double>(series.size());
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" font-size=\"15\">{}</text>\n",
      W, H, L, svg_escape(title));
  for (int panel = 0; panel < 2; ++panel) {
    const double x0 = panel_x[panel];
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n", x0, T0, PW, PH);
    for (int t : tok_set) {
      const double x = xpos(panel, t);
      s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#ddd\"/><text x=\"{0}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
                       x, T0, T0 + PH, T0 + PH + 16, t);
    }
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">tokens (log)</text>\n", x0 + PW / 2, T0 + PH + 34);
    if (panel == 0) {
      for (double e = ly0; e <= ly1 + 1e-9; e += 1) {
        const double y = T0 + PH - (e - ly0) / (ly1 - ly0) * PH;
        s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#ddd\"/><text x=\"{3}\" y=\"{4}\" text-anchor=\"end\">{5:g}</text>\n",
                         x0, y, x0 + PW, x0 - 4, y + 4, std::pow(10.0, e));
      }
      s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">µs per layer (log)</text>\n", x0 + PW / 2, T0 - 8);
    } else {
      for (double p = 0; p <= pmax + 1e-9; p += 20) {
        const double y = y_pct(p);
        s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#ddd\"/><text x=\"{3}\" y=\"{4}\" text-anchor=\"end\">{5:g}</text>\n",
                         x0, y, x0 + PW, x0 - 4, y + 4, p);
      }
      s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">% of measured read bandwidth ({:.1f} GB/s)</text>\n",
                       x0 + PW / 2, T0 - 8, bw_gbps);
    }
  }
  int ci = 0;
  double ly = T0 + PH + 56;
  for (auto& [name, ps] : series) {
    std::sort(ps.begin(), ps.end(), [](const Point* a, const Point* b) { return a->tokens < b->tokens; });
    const char* col = colors[ci++ % 10];
    for (int panel = 0; panel < 2; ++panel) {
      std::string poly;
      for (const Point* p : ps) {
        const double x = xpos(panel, p->tokens), y = panel == 0 ? y_us(p->median_us) : y_pct(p->pct);
        poly += fmt::format("{:.1f},{:.1f} ", x, y);
        s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", x, y, col);
      }
      s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", poly, col);
    }
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"3\"/><text x=\"{4}\" y=\"{5}\">{6}</text>\n",
                     L, ly, L + 24, col, L + 30, ly + 4, svg_escape(name));
    ly += 18;
  }
  s += "</svg>\n";
  util::write_file_atomic(path, s);
}

void run_bench(const Options& o) {
  if (o.device != "cpu")
    throw Error(fmt::format("--device {}: this command benchmarks the CPU kernels only (--device cpu)", o.device));
  if (o.kernel != "optimized" && o.kernel != "reference")
    throw Error(fmt::format("--kernel '{}': expected optimized or reference", o.kernel));
  if (o.reps < 1) throw Error("--reps must be at least 1");
  std::vector<int> tokens;
  for (const auto& t : split(o.tokens)) {
    int v = 0;
    try {
      v = std::stoi(t);
    } catch (...) {
      v = 0;
    }
    if (v < 1) throw Error(fmt::format("--tokens: '{}' is not a positive integer", t));
    tokens.push_back(v);
  }
  std::vector<const BenchShape*> shapes;
  for (const auto& n : split(o.shapes)) shapes.push_back(&shape_by_name(n));
  std::vector<const SchemeInfo*> schemes;
  for (const auto& n : split(o.schemes)) schemes.push_back(&scheme_by_name(n));
  if (shapes.empty() || schemes.empty() || tokens.empty()) throw Error("need at least one --shape, --scheme and --tokens value");

  const int threads = cpu::ThreadPool::resolve_threads(bounded_threads(o.threads));
  const cpu::Isa isa = cpu::default_isa();
  // Sizes from the machine: weight copies rotate over ≥ 4 × LLC bytes (every layer of a shape is
  // far beyond the cache, or enough copies of a small one are), the caches are flushed with
  // 2 × LLC before each repetition, and the bandwidth probe reads the same span.
  const cpu::CacheInfo llc = cpu::last_level_cache();
  const double llc_b = static_cast<double>(llc.llc_bytes);
  fmt::print(stderr, "qmoe bench: {}, {} threads, ISA {}; LLC {:.1f} MiB ({})\n", cpu::cpu_model_name(), threads,
             cpu::isa_name(isa), llc_b / 1048576.0,
             llc.from_sysfs ? fmt::format("L{} from sysfs, {} instance(s)", llc.level, llc.instances)
                            : std::string("not in sysfs: assumed"));
  const size_t flush_bytes = std::max<size_t>(size_t{64} << 20, static_cast<size_t>(2 * llc.llc_bytes));

  std::vector<Point> points;
  for (const BenchShape* sh : shapes) {
    const int E = o.experts > 0 ? o.experts : sh->E;
    if (E < sh->K) throw Error(fmt::format("--experts {} is smaller than top-k {} of {}", E, sh->K, sh->name));
    for (const SchemeInfo* sc : schemes) {
      const double gb = E * expert_bytes(*sc, sh->H, sh->I) / 1e9;
      if (gb > o.max_weight_gb)
        throw Error(fmt::format("{} with {} needs {:.1f} GB of expert weights for E = {} (limit {:.1f} GB, --max-weight-gb); "
                                "use --experts N to benchmark fewer experts",
                                sh->name, sc->name, gb, E, o.max_weight_gb));
      fmt::print(stderr, "qmoe bench: {} {} (E={} K={} H={} I={}): generating {:.2f} GB of weights...\n", sh->name, sc->name,
                 E, sh->K, sh->H, sh->I, gb);
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
                                                      std::max(1.0, std::floor(o.max_weight_gb * 1e9 / layer_bytes))));
      for (int c = 1; c < ncopies; ++c) {
        spec.seed = o.seed + 1000003ull * static_cast<uint64_t>(c);
        copies.push_back(cpu::make_random_expert_params(spec));
      }
      const double working_set = layer_bytes * ncopies;
      const size_t probe_bytes = static_cast<size_t>(std::clamp(working_set, 4.0 * llc_b, 2.0 * (1ull << 30)));
      const cpu::BandwidthResult bw = cpu::measure_read_bandwidth(threads, probe_bytes);
      fmt::print(stderr,
                 "qmoe bench:   working set {:.1f} MB ({} cop{} of {:.1f} MB; {:.1f} × LLC), read bandwidth over {:.0f} MB: "
                 "{:.1f} GB/s (median of {}; max {:.1f})\n",
                 working_set / 1e6, ncopies, ncopies == 1 ? "y" : "ies", layer_bytes / 1e6, working_set / llc_b,
                 static_cast<double>(bw.bytes) / 1e6, bw.median_gbps, bw.runs, bw.max_gbps);
      if (working_set < 4.0 * llc_b)
        fmt::print(stderr, "qmoe bench:   WARNING: working set below 4 × LLC (--max-weight-gb limits the copies); "
                           "figures may include cache hits\n");
      for (int T : tokens) {
        std::mt19937_64 rng(o.seed * 7919 + static_cast<uint64_t>(T));
        std::normal_distribution<float> nd;
        std::vector<float> x(static_cast<size_t>(T) * sh->H), out(x.size());
        for (float& v : x) v = bf16_round(nd(rng));
        std::vector<int32_t> ids;
        std::vector<float> w;
        std::vector<double> us, touched, uniq;
        const int warm = o.kernel == "reference" ? 0 : 1;
        for (int r = 0; r < warm + o.reps; ++r) {
          random_routing(rng, T, E, sh->K, ids, w);
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
          else experts_optimized(a, threads);
          const double dt = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
          if (r < warm) continue;
          std::set<int32_t> u(ids.begin(), ids.end());
          us.push_back(dt);
          uniq.push_back(static_cast<double>(u.size()));
          touched.push_back(static_cast<double>(u.size()) * ebytes + 2.0 * 4.0 * T * sh->H);
        }
        std::vector<double> sorted = us;
        std::sort(sorted.begin(), sorted.end());
        Point p;
        p.shape = sh->name;
        p.scheme = std::string(sc->name);
        p.tokens = T;
        p.threads = threads;
        p.E = E;
        p.K = sh->K;
        p.H = sh->H;
        p.I = sh->I;
        p.median_us = sorted[sorted.size() / 2];
        p.min_us = sorted.front();
        double tb = 0, ue = 0;
        for (size_t i = 0; i < touched.size(); ++i) {
          tb += touched[i];
          ue += uniq[i];
        }
        p.touched_bytes = tb / static_cast<double>(touched.size());
        p.unique_experts = ue / static_cast<double>(uniq.size());
        p.gbps = p.touched_bytes / (p.median_us * 1e-6) / 1e9;
        p.bw_gbps = bw.median_gbps;
        p.working_set = working_set;
        p.copies = ncopies;
        p.pct = 100.0 * p.gbps / bw.median_gbps;
        p.tflops = 6.0 * T * sh->K * static_cast<double>(sh->H) * sh->I / (p.median_us * 1e-6) / 1e12;
        fmt::print(stderr, "  T={:<5} {:>12.1f} µs  {:>7.2f} GB/s ({:5.1f}% of bw)  {:>8.1f} GFLOP/s\n", T, p.median_us, p.gbps,
                   p.pct, p.tflops * 1e3);
        if (p.pct > 100.0)
          fmt::print(stderr, "  WARNING: T={} reads {:.1f}% of the measured bandwidth: more than memory can deliver, so part "
                             "of it came from cache (a benchmark bug) or the probe ran while the host was busier\n",
                     T, p.pct);
        points.push_back(p);
      }
    }
  }

  if (o.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& p : points)
      arr.push_back({{"shape", p.shape},
                     {"scheme", p.scheme},
                     {"tokens", p.tokens},
                     {"device", "cpu"},
                     {"kernel", o.kernel},
                     {"isa", std::string(cpu::isa_name(isa))},
                     {"threads", p.threads},
                     {"E", p.E},
                     {"K", p.K},
                     {"H", p.H},
                     {"I", p.I},
                     {"reps", o.reps},
                     {"median_us", p.median_us},
                     {"min_us", p.min_us},
                     {"tokens_per_s", p.tokens / (p.median_us * 1e-6)},
                     {"unique_experts", p.unique_experts},
                     {"touched_bytes", p.touched_bytes},
                     {"gbps", p.gbps},
                     {"bandwidth_gbps", p.bw_gbps},
                     {"pct_of_bandwidth", p.pct},
                     {"above_bandwidth", p.pct > 100.0},
                     {"llc_bytes", llc.llc_bytes},
                     {"llc_from_sysfs", llc.from_sysfs},
                     {"working_set_bytes", p.working_set},
                     {"weight_copies", p.copies},
                     {"cpu", cpu::cpu_model_name()},
                     {"tflops", p.tflops}});
    fmt::print("{}\n", arr.dump(2));
  } else {
    fmt::print("device cpu: {} ({} threads, ISA {}, kernel {}), LLC {:.1f} MiB{}\n", cpu::cpu_model_name(), threads,
               cpu::isa_name(isa), o.kernel, llc_b / 1048576.0, llc.from_sysfs ? "" : " (assumed)");
    fmt::print("{:<14} {:<32} {:>6} {:>12} {:>11} {:>11} {:>8} {:>8} {:>7} {:>9} {:>10}\n", "shape", "scheme", "tokens",
               "µs/layer", "tokens/s", "touched MB", "GB/s", "bw GB/s", "%bw", "GFLOP/s", "set MB");
    for (const auto& p : points)
      fmt::print("{:<14} {:<32} {:>6} {:>12.1f} {:>11.0f} {:>11.1f} {:>8.2f} {:>8.1f} {:>6.1f}%{} {:>9.1f} {:>10.0f}\n", p.shape,
                 p.scheme, p.tokens, p.median_us, p.tokens / (p.median_us * 1e-6), p.touched_bytes / 1e6, p.gbps, p.bw_gbps,
                 p.pct, p.pct > 100.0 ? "!" : " ", p.tflops * 1e3, p.working_set / 1e6);
    if (std::any_of(points.begin(), points.end(), [](const Point& p) { return p.pct > 100.0; }))
      fmt::print("! above 100% of the measured bandwidth: partly served from cache or a busier probe — not a valid "
                 "memory-bound figure\n");
  }
  if (!o.plot.empty()) {
    write_svg(o.plot, points, points.empty() ? 0.0 : points.front().bw_gbps,
              fmt::format("qmoe bench --device cpu ({} threads, {}, {} kernel)", threads, cpu::isa_name(isa), o.kernel));
    fmt::print(stderr, "qmoe bench: wrote {}\n", o.plot);
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto opt = std::make_shared<Options>();
  auto* sub = app.add_subcommand("bench", "Benchmark one MoE layer's experts on random weights (CPU kernels)");
  sub->add_option("--device", opt->device, "Device (cpu)")->capture_default_str();
  sub->add_option("--shape", opt->shapes,
                  "Shapes, comma separated: mixtral-8x7b, deepseek-v3, qwen3-30b-a3b, gpt-oss-120b, gpt-oss-20b, tiny, small")
      ->capture_default_str();
  sub->add_option("--scheme", opt->schemes, "Schemes, comma separated (names or aliases of `qmoe schemes`)")->capture_default_str();
  sub->add_option("--tokens", opt->tokens, "Token counts, comma separated")->capture_default_str();
  sub->add_option("--threads", opt->threads, "Threads (0: all cores)")->capture_default_str();
  sub->add_flag("--json", opt->json, "Print a JSON array instead of the table");
  sub->add_option("--plot", opt->plot, "Write an SVG plot (µs per layer and % of bandwidth vs tokens)");
  sub->add_option("--kernel", opt->kernel, "optimized | reference")->capture_default_str();
  sub->add_option("--reps", opt->reps, "Timed repetitions per point (median reported)")->capture_default_str();
  sub->add_option("--experts", opt->experts, "Override the number of experts E (to fit memory)");
  sub->add_option("--max-weight-gb", opt->max_weight_gb, "Refuse layers whose expert weights exceed this")->capture_default_str();
  sub->add_option("--seed", opt->seed, "Random seed")->capture_default_str();
  sub->callback([opt] { run_bench(*opt); });
}

}  // namespace qmoe::cli
