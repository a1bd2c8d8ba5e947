// The benchmark face (bench.h): shapes, option checks, floors, routing, JSON / table / SVG / CSV.
#include "bench/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>

#include "qmoe/cuda.h"
#include "qmoe/error.h"
#include "util/files.h"

namespace qmoe::bench {

const std::vector<Shape>& all_shapes() {
  static const std::vector<Shape> k = {
      {"mixtral-8x7b", 8, 2, 4096, 14336, false},  {"deepseek-v3", 256, 8, 7168, 2048, false},
      {"qwen3-30b-a3b", 128, 8, 2048, 768, false}, {"gpt-oss-120b", 128, 4, 2880, 2880, true},
      {"gpt-oss-20b", 32, 4, 2880, 2880, true},    {"qwen3-235b-a22b", 128, 8, 4096, 1536, false},    {"tiny", 8, 2, 512, 256, false},
      {"small", 16, 4, 1024, 512, false},
  };
  return k;
}

const Shape& shape_by_name(const std::string& n) {
  for (const auto& s : all_shapes())
    if (n == s.name) return s;
  std::string known;
  for (const auto& s : all_shapes()) known += (known.empty() ? "" : ", ") + std::string(s.name);
  throw Error(fmt::format("unknown --shape '{}'; known shapes: {}", n, known));
}

std::vector<std::string> split_list(const std::string& s) {
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

std::vector<int> parse_tokens(const std::string& s) {
  std::vector<int> out;
  for (const auto& t : split_list(s)) {
    size_t used = 0;
    long v = 0;
    try {
      v = std::stol(t, &used);
    } catch (...) {
      used = 0;
    }
    if (used != t.size() || v < 1 || v > (1 << 24))
      throw Error(fmt::format("--tokens: '{}' is not a positive integer (1 … 16777216)", t));
    out.push_back(static_cast<int>(v));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

namespace {
// "tileN" for a token tile N of cuda::kTokenTiles → N, else 0.
int tile_suffix(const std::string& suf) {
  for (int t : cuda::kTokenTiles)
    if (suf == "tile" + std::to_string(t)) return t;
  return 0;
}
// "ksN" for a K split count N in [1, cuda::kMaxKSplit] → N, else 0.
int ksplit_suffix(const std::string& suf) {
  for (int k = 1; k <= cuda::kMaxKSplit; ++k)
    if (suf == "ks" + std::to_string(k)) return k;
  return 0;
}
}  // namespace

SchemeEntry parse_scheme_entry(const std::string& entry) {
  SchemeEntry e;
  const size_t plus = entry.find('+');
  e.scheme = &scheme_by_name(entry.substr(0, plus));
  e.label = std::string(e.scheme->name);
  for (size_t p = plus; p != std::string::npos;) {
    const size_t q = entry.find('+', p + 1);
    const std::string suf = entry.substr(p + 1, q == std::string::npos ? std::string::npos : q - p - 1);
    if (suf == "bf16act") e.bf16_act = true;
    else if (suf == "xbf16") e.x_bf16 = true;
    else if (suf == "route") e.route = true;
    else if (suf == "nowg") e.no_wgmma = true;
    else if (suf == "f8mma") e.fp8_mma = true;
    else if (const int t = tile_suffix(suf)) e.token_tile = t;
    else if (const int k = ksplit_suffix(suf)) e.ksplit = k;
    else
      throw Error(fmt::format("--scheme '{}': unknown suffix '+{}' (known: +bf16act, +xbf16, +route, +nowg, "
                              "+f8mma, +tile8|16|32|64|128, +ks1…{})",
                              entry, suf, cuda::kMaxKSplit));
    e.label += "+" + suf;
    p = q;
  }
  return e;
}

Plan resolve(const Options& o) {
  Plan p;
  p.opt = o;
  if (o.device != "cpu" && o.device != "cuda")
    throw Error(fmt::format("--device '{}': expected cpu or cuda", o.device));
  if (o.kernel != "optimized" && o.kernel != "reference")
    throw Error(fmt::format("--kernel '{}': expected optimized or reference", o.kernel));
  if (o.device == "cuda" && o.kernel != "optimized")
    throw Error("--kernel reference is a CPU kernel: --device cuda runs the CUDA kernels (--kernel optimized)");
  if (o.reps < 1) throw Error("--reps must be at least 1");
  if (o.ep < 1 || o.tp < 1) throw Error(fmt::format("--ep and --tp must be at least 1, got {} and {}", o.ep, o.tp));
  if ((o.distributed || o.ep * o.tp > 1) && o.device != "cuda")
    throw Error("--ep / --tp spread the layer over GPUs: add --device cuda");
  if (o.experts < 0) throw Error("--experts must be >= 1 (or 0: the shape's own E)");
  if (o.max_weight_gb < 0) throw Error("--max-weight-gb must be > 0 (or 0: the device's default)");
  if (o.peak_tflops < 0) throw Error("--peak-tflops must be >= 0");
  if (o.copies < 0) throw Error("--copies must be >= 0 (0: enough to defeat the L2)");
  if (o.token_tile != 0 && !cuda::is_token_tile(o.token_tile))
    throw Error(fmt::format("--token-tile {}: expected 8, 16, 32, 64 or 128", o.token_tile));
  if (o.probe_gib < 4.0 && o.device == "cuda")
    throw Error("--probe-gib: the CUDA read-bandwidth probe streams at least 4 GiB");
  p.tokens = parse_tokens(o.tokens);
  for (const auto& n : split_list(o.shapes)) p.shapes.push_back(&shape_by_name(n));
  for (const auto& n : split_list(o.schemes)) {
    if (n == "all") {
      for (const auto& s : all_schemes()) p.schemes.push_back(parse_scheme_entry(std::string(s.name)));
      continue;
    }
    SchemeEntry e = parse_scheme_entry(n);
    if (o.device == "cpu" && (e.x_bf16 || e.route || e.no_wgmma || e.fp8_mma || e.token_tile != 0 || e.ksplit != 0))
      throw Error(fmt::format("--scheme '{}': on the CPU only +bf16act applies (the other +suffixes select CUDA "
                              "variants: --device cuda)", n));
    p.schemes.push_back(e);
  }
  if (p.shapes.empty() || p.schemes.empty() || p.tokens.empty())
    throw Error("need at least one --shape, --scheme and --tokens value");
  if (o.device == "cpu" && (o.copies != 0 || o.token_tile != 0))
    throw Error("--copies and --token-tile are CUDA options (--device cuda)");
  for (const Shape* sh : p.shapes) {
    const int E = o.experts > 0 ? o.experts : sh->E;
    if (E < sh->K) throw Error(fmt::format("--experts {} is smaller than top-k {} of {}", E, sh->K, sh->name));
  }
  p.max_weight_gb = o.max_weight_gb > 0 ? o.max_weight_gb : (o.device == "cuda" ? 40.0 : 8.0);
  return p;
}

// ---- floors ---------------------------------------------------------------------------------

Floors floors(double bytes, double flops, const Limits& lim) {
  Floors f;
  f.mem_us = lim.mem_bytes_per_s > 0 ? bytes / lim.mem_bytes_per_s * 1e6 : 0.0;
  f.compute_us = lim.peak_flops > 0 ? flops / lim.peak_flops * 1e6 : 0.0;
  f.floor_us = std::max(f.mem_us, f.compute_us);
  f.bound = f.mem_us >= f.compute_us ? 'M' : 'C';
  return f;
}

double layer_flops(int T, int K, int H, int I) { return 6.0 * T * K * static_cast<double>(H) * I; }

double expected_unique_experts(int E, int K, int T) {
  return E * (1.0 - std::pow(1.0 - static_cast<double>(K) / E, T));
}

double estimated_expert_bytes(const SchemeInfo& s, int H, int I) {
  const double n = 3.0 * H * I;
  switch (s.weight) {
    case WeightFormat::BF16: return n * 2.0;
    case WeightFormat::Fp8E4M3:
    case WeightFormat::Int8: return n + (s.weight_scale == WeightScale::PerChannel ? 4.0 * (2.0 * I + H) : 8.0);
    default: return n * s.bits_per_weight / 8.0;
  }
}

double h200_peak_flops(const SchemeInfo& s) {
  switch (s.act) {
    case ActQuant::None:
    case ActQuant::Mxfp6E2M3:
    case ActQuant::Mxfp6E3M2: return 790e12;
    default: return 1580e12;
  }
}

void random_routing(uint64_t seed, int T, int E, int K, std::vector<int32_t>& ids, std::vector<float>& w) {
  std::mt19937_64 rng(seed);
  ids.resize(static_cast<size_t>(T) * K);
  w.resize(ids.size());
  std::vector<int> pool(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) pool[static_cast<size_t>(e)] = e;
  std::uniform_real_distribution<float> u(0.1f, 1.0f);
  for (int t = 0; t < T; ++t) {
    // K steps of a Fisher–Yates shuffle: K distinct experts, uniform.
    for (int k = 0; k < K; ++k) {
      const auto j = static_cast<size_t>(k) + static_cast<size_t>(rng() % static_cast<uint64_t>(E - k));
      std::swap(pool[static_cast<size_t>(k)], pool[j]);
    }
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(t) * K + k;
      ids[i] = pool[static_cast<size_t>(k)];
      sum += w[i] = u(rng);
    }
    for (int k = 0; k < K; ++k) w[static_cast<size_t>(t) * K + k] /= sum;
  }
}

Report run(const Plan& plan) { return plan.opt.device == "cuda" ? run_cuda(plan) : run_cpu(plan); }

// ---- outputs --------------------------------------------------------------------------------

namespace {

nlohmann::json num_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

std::string csv_num(double v, int prec) { return std::isfinite(v) ? fmt::format("{:.{}f}", v, prec) : "nan"; }

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

}  // namespace

nlohmann::json to_json(const Report& r) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& p : r.points) {
    nlohmann::json j = {{"shape", p.shape},
                        {"scheme", p.scheme},
                        {"tokens", p.tokens},
                        {"device", r.device},
                        {"kernel", r.kernel},
                        {"E", p.E},
                        {"K", p.K},
                        {"H", p.H},
                        {"I", p.I},
                        {"reps", p.reps},
                        {"median_us", p.median_us},
                        {"min_us", p.min_us},
                        {"tokens_per_s", p.tokens / (p.median_us * 1e-6)},
                        {"unique_experts", p.unique_experts},
                        {"touched_bytes", p.touched_bytes},
                        {"flops", p.flops},
                        {"gbps", p.gbps},
                        {"tflops", p.tflops},
                        {"bandwidth_gbps", p.bandwidth_gbps},
                        {"pct_of_bandwidth", p.pct_of_bandwidth},
                        {"above_bandwidth", p.pct_of_bandwidth > 100.0},
                        {"working_set_bytes", p.working_set_bytes},
                        {"weight_copies", p.weight_copies},
                        {"mem_floor_us", p.floor.mem_us},
                        {"compute_floor_us", p.floor.compute_us > 0 ? nlohmann::json(p.floor.compute_us) : nlohmann::json(nullptr)},
                        {"floor_us", p.floor.floor_us},
                        {"bound", std::string(1, p.floor.bound)},
                        {"pct_floor", 100.0 * p.floor.floor_us / p.median_us},
                        {"pct_mem_floor", 100.0 * p.floor.mem_us / p.median_us},
                        {"measured_mem_floor_us", p.measured_mem_floor_us},
                        {"pct_measured_mem_floor", 100.0 * p.measured_mem_floor_us / p.median_us}};
    if (r.device == "cuda") {
      j["cublas_bf16_us"] = num_or_null(p.cublas_bf16_us);
      j["cublas_anchor"] = r.anchor_method;
      j["speedup_vs_cublas_bf16"] = num_or_null(p.cublas_bf16_us / p.median_us);
      j["vllm_bf16_us"] = num_or_null(p.vllm_bf16_us);
      j["vllm_int8_us"] = num_or_null(p.vllm_int8_us);
      j["vllm_fp8_us"] = num_or_null(p.vllm_fp8_us);
    }
    for (auto it = r.device_fields.begin(); it != r.device_fields.end(); ++it) j[it.key()] = it.value();
    arr.push_back(std::move(j));
  }
  return arr;
}

std::string summary_table(const Report& r) {
  std::vector<int> tokens;
  std::vector<std::pair<std::string, std::string>> keys;
  for (const auto& p : r.points) {
    if (std::find(tokens.begin(), tokens.end(), p.tokens) == tokens.end()) tokens.push_back(p.tokens);
    if (std::find(keys.begin(), keys.end(), std::make_pair(p.shape, p.scheme)) == keys.end())
      keys.emplace_back(p.shape, p.scheme);
  }
  std::sort(tokens.begin(), tokens.end());
  std::string s = "| shape | scheme |";
  for (int T : tokens) s += fmt::format(" T={} |", T);
  s += "\n|---|---|";
  for (size_t i = 0; i < tokens.size(); ++i) s += "---:|";
  s += "\n";
  auto find = [&](const std::string& shape, const std::string& scheme, int T) -> const Point* {
    for (const auto& p : r.points)
      if (p.shape == shape && p.scheme == scheme && p.tokens == T) return &p;
    return nullptr;
  };
  // Under each shape: the in-run cuBLAS anchor and vLLM's performance.md §10 figures (CUDA).
  auto anchor_rows = [&](const std::string& shape) {
    if (r.device != "cuda") return;
    const std::string scheme0 = [&] {
      for (const auto& [sh, sc] : keys)
        if (sh == shape) return sc;
      return std::string();
    }();
    struct Col {
      const char* name;
      double Point::*field;
    };
    const Col cols[] = {{"cuBLAS bf16 grouped GEMMs, this run", &Point::cublas_bf16_us},
                        {"vLLM bf16 (perf §10)", &Point::vllm_bf16_us},
                        {"vLLM INT8 W8A8 (perf §10)", &Point::vllm_int8_us},
                        {"vLLM FP8 W8A8 (perf §10)", &Point::vllm_fp8_us}};
    for (const auto& c : cols) {
      bool any = false;
      std::string row = fmt::format("| {} | *{}* |", shape, c.name);
      for (int T : tokens) {
        const Point* p = find(shape, scheme0, T);
        const double v = p ? p->*c.field : NAN;
        any = any || std::isfinite(v);
        row += std::isfinite(v) ? fmt::format(" *{:.0f}* |", v) : std::string(" - |");
      }
      if (any) s += row + "\n";
    }
  };
  std::string last;
  for (const auto& [shape, scheme] : keys) {
    if (!last.empty() && shape != last) anchor_rows(last);
    last = shape;
    s += fmt::format("| {} | {} |", shape, scheme);
    for (int T : tokens) {
      const Point* p = find(shape, scheme, T);
      s += p ? fmt::format(" {:.0f} ({:.0f}%) |", p->median_us, 100.0 * p->floor.floor_us / p->median_us)
             : std::string(" - |");
    }
    s += "\n";
  }
  if (!last.empty()) anchor_rows(last);
  s += r.device == "cuda" ? "(µs per layer, % of the performance.md §4 floor at 4.3 TB/s and 790 / 1580 TFLOP/s)\n"
                          : "(µs per layer, % of the floor at the measured read bandwidth)\n";
  return s;
}

void print_table(const Report& r) {
  fmt::print("{}\n", r.header);
  fmt::print("{:<14} {:<32} {:>6} {:>12} {:>11} {:>11} {:>8} {:>8} {:>7} {:>9} {:>10} {:>10} {:>7}{}\n", "shape", "scheme",
             "tokens", "µs/layer", "tokens/s", "touched MB", "GB/s", "bw GB/s", "%bw", "GFLOP/s", "set MB", "floor µs",
             "%floor", r.device == "cuda" ? "  cuBLAS bf16 µs" : "");
  for (const auto& p : r.points) {
    fmt::print("{:<14} {:<32} {:>6} {:>12.1f} {:>11.0f} {:>11.1f} {:>8.2f} {:>8.1f} {:>6.1f}%{} {:>9.1f} {:>10.0f} {:>8.1f} {} "
               "{:>6.1f}%",
               p.shape, p.scheme, p.tokens, p.median_us, p.tokens / (p.median_us * 1e-6), p.touched_bytes / 1e6, p.gbps,
               p.bandwidth_gbps, p.pct_of_bandwidth, p.pct_of_bandwidth > 100.0 ? "!" : " ", p.tflops * 1e3,
               p.working_set_bytes / 1e6, p.floor.floor_us, p.floor.bound, 100.0 * p.floor.floor_us / p.median_us);
    if (r.device == "cuda") fmt::print("  {:>14.1f}", p.cublas_bf16_us);
    fmt::print("\n");
  }
  if (std::any_of(r.points.begin(), r.points.end(), [](const Point& p) { return p.pct_of_bandwidth > 100.0; }))
    fmt::print("! above 100% of the measured bandwidth: partly served from cache or a busier probe — not a valid "
               "memory-bound figure\n");
  if (!r.anchor_method.empty()) fmt::print("cuBLAS anchor: {}\n", r.anchor_method);
  fmt::print("\n{}", summary_table(r));
}

std::string svg(const Report& r) {
  const auto& pts = r.points;
  if (pts.empty()) throw Error("--plot: no points to plot");
  std::map<std::string, std::vector<const Point*>> series;
  std::set<int> tok_set;
  for (const auto& p : pts) {
    series[p.shape + " / " + p.scheme].push_back(&p);
    tok_set.insert(p.tokens);
  }
  const double bw_gbps = pts.front().bandwidth_gbps;
  const double W = 1000, PW = 420, PH = 300, L = 70, T0 = 50;
  const double panel_x[2] = {L, L + PW + 90};
  const double tmin = *tok_set.begin(), tmax = std::max<double>(*tok_set.rbegin(), tok_set.size() == 1 ? tmin * 2 : 0.0);
  double umin = 1e300, umax = 0, pmax = 100;
  for (const auto& p : pts) {
    umin = std::min(umin, p.median_us);
    umax = std::max(umax, p.median_us);
    pmax = std::max(pmax, p.pct_of_bandwidth);
  }
  const double ly0 = std::floor(std::log10(umin)), ly1 = std::max(ly0 + 1, std::ceil(std::log10(umax)));
  pmax = std::ceil(pmax / 20.0) * 20.0;
  auto xpos = [&](int panel, double t) {
    const double f = tmax > tmin ? (std::log(t) - std::log(tmin)) / (std::log(tmax) - std::log(tmin)) : 0.5;
    return panel_x[panel] + f * PW;
  };
  auto y_us = [&](double us) { return T0 + PH - (std::log10(us) - ly0) / (ly1 - ly0) * PH; };
  auto y_pct = [&](double p) { return T0 + PH - p / pmax * PH; };
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                          "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
  const double H = T0 + PH + 70 + 18.0 * static_cast<double>(series.size());
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" font-size=\"15\">{}</text>\n",
      W, H, L, svg_escape(r.title));
  for (int panel = 0; panel < 2; ++panel) {
    const double x0 = panel_x[panel];
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n", x0, T0, PW, PH);
    for (int t : tok_set) {
      const double x = xpos(panel, t);
      s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#ddd\"/><text x=\"{0}\" y=\"{3}\" "
                       "text-anchor=\"middle\">{4}</text>\n",
                       x, T0, T0 + PH, T0 + PH + 16, t);
    }
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">tokens (log)</text>\n", x0 + PW / 2, T0 + PH + 34);
    if (panel == 0) {
      for (double e = ly0; e <= ly1 + 1e-9; e += 1) {
        const double y = T0 + PH - (e - ly0) / (ly1 - ly0) * PH;
        s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#ddd\"/><text x=\"{3}\" y=\"{4}\" "
                         "text-anchor=\"end\">{5:g}</text>\n",
                         x0, y, x0 + PW, x0 - 4, y + 4, std::pow(10.0, e));
      }
      s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">µs per layer (log)</text>\n", x0 + PW / 2, T0 - 8);
    } else {
      for (double p = 0; p <= pmax + 1e-9; p += 20) {
        const double y = y_pct(p);
        s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#ddd\"/><text x=\"{3}\" y=\"{4}\" "
                         "text-anchor=\"end\">{5:g}</text>\n",
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
        const double x = xpos(panel, p->tokens), y = panel == 0 ? y_us(p->median_us) : y_pct(p->pct_of_bandwidth);
        poly += fmt::format("{:.1f},{:.1f} ", x, y);
        s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", x, y, col);
      }
      s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", poly, col);
    }
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"3\"/><text x=\"{4}\" "
                     "y=\"{5}\">{6}</text>\n",
                     L, ly, L + 24, col, L + 30, ly + 4, svg_escape(name));
    ly += 18;
  }
  s += "</svg>\n";
  return s;
}

void write_svg(const std::string& path, const Report& r) { util::write_file_atomic(path, svg(r)); }

std::string csv(const Report& r) {
  std::string s =
      "shape,scheme,T,U,us,GBps,TFLOPps,floor_us,bound,pct_floor,vllm_bf16_us,vllm_int8_us,vllm_fp8_us,"
      "mem_floor_us,bandwidth_GBps,pct_bandwidth,cublas_bf16_us\n";
  for (const auto& p : r.points)
    s += fmt::format("{},{},{},{},{:.2f},{:.1f},{:.2f},{:.2f},{},{:.1f},{},{},{},{:.2f},{:.1f},{:.1f},{}\n", p.shape,
                     p.scheme, p.tokens, static_cast<int>(std::lround(p.unique_experts)), p.median_us, p.gbps, p.tflops,
                     p.floor.floor_us, p.floor.bound, 100.0 * p.floor.floor_us / p.median_us, csv_num(p.vllm_bf16_us, 1),
                     csv_num(p.vllm_int8_us, 1), csv_num(p.vllm_fp8_us, 1), p.floor.mem_us, p.bandwidth_gbps,
                     p.pct_of_bandwidth, csv_num(p.cublas_bf16_us, 2));
  return s;
}

void write_csv(const std::string& path, const Report& r) { util::write_file_atomic(path, csv(r)); }

}  // namespace qmoe::bench
