// run_demo: the main job. A synthetic BF16 MoE layer is quantized with every registry scheme,
// loaded back through MoELayer::from_checkpoint, run on the CPU (and extra devices), compared with
// the unquantized fp32 layer and timed.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "qmoe/error.h"
#include "qmoe/quantizer.h"
#include "quantizer/progress.h"

namespace qmoe {

namespace fs = std::filesystem;
using quantizer_detail::Progress;
using quantizer_detail::status_line;

namespace {

// The kernel check runs the scalar reference on this many tokens; optimized kernels may keep a
// bf16 intermediate for weight-only schemes (conformance tolerances ≤ 1.6e-2), so 2e-2 only
// catches real bugs.
constexpr int kCheckTokens = 8;
constexpr double kKernelCheckTolerance = 2e-2;

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint64_t dir_safetensors_bytes(const fs::path& d) {
  uint64_t n = 0;
  for (const auto& e : fs::directory_iterator(d))
    if (e.is_regular_file() && e.path().extension() == ".safetensors") n += e.file_size();
  return n;
}

// Time a runner: one warm-up, then `repeats` timed runs; the last output is kept in `out`.
DemoDeviceResult measure(const std::string& device, const DemoRunner& run, const std::vector<float>& x,
                         const MoEWorkspace& ws, const std::vector<float>& ref, int repeats, int T) {
  std::vector<float> out(ref.size());
  run(x.data(), ws, out.data());
  DemoDeviceResult r;
  r.device = device;
  r.rel_l2 = rel_l2(out, ref);
  for (float v : out)
    if (!std::isfinite(v)) throw Error(fmt::format("{}: the layer output has non-finite values", device));
  std::vector<double> times;
  for (int i = 0; i < std::max(1, repeats); ++i) times.push_back(run(x.data(), ws, out.data()));
  r.us_per_layer = median(times);
  r.tokens_per_s = r.us_per_layer > 0 ? T * 1e6 / r.us_per_layer : 0.0;
  return r;
}

DemoRunner cpu_runner(const MoELayer& layer) {
  // run() grows the workspace's scratch: keep one private copy of the caller's (routing-only) one.
  auto own = std::make_shared<std::optional<MoEWorkspace>>();
  return [&layer, own](const float* x, const MoEWorkspace& ws, float* out) {
    if (!own->has_value() || (*own)->topk_ids != ws.topk_ids || (*own)->topk_weights != ws.topk_weights) *own = ws;
    const auto t0 = std::chrono::steady_clock::now();
    layer.run(x, **own, out);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  };
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw Error(fmt::format("cannot write {}", p.string()));
}

}  // namespace

bool DemoResult::all_ok() const {
  for (const auto& r : rows)
    if (!r.ok) return false;
  return !rows.empty();
}

std::string DemoResult::table() const {
  std::string s;
  s += fmt::format("qmoe demo: synthetic {} layer '{}' (H={}, I={}, E={}, K={}), T={} tokens\n", shape.model_type,
                   shape.name, shape.hidden, shape.inter, shape.experts, shape.top_k, tokens);
  s += fmt::format("{:<30} {:>6} {:>9} {:>9}", "scheme", "bits/w", "size MB", "ref chk");
  for (const auto& d : devices)
    s += fmt::format(" | {:>10} {:>11} {:>10}", d + " relL2", d + " us/layer", d + " tok/s");
  s += "\n";
  const size_t width = s.size() - s.rfind('\n', s.size() - 2) - 2;
  s += std::string(width, '-') + "\n";
  for (const auto& r : rows) {
    s += fmt::format("{:<30} {:>6.2f} {:>9.2f} {:>9}", r.scheme, r.bits_per_weight, r.checkpoint_mb,
                     r.kernel_check < 0 ? std::string("-") : fmt::format("{:.1e}", r.kernel_check));
    if (!r.ok) {
      s += "  FAILED: " + r.error + "\n";
      continue;
    }
    for (const auto& d : devices) {
      auto it = std::find_if(r.devices.begin(), r.devices.end(), [&](const auto& x) { return x.device == d; });
      if (it == r.devices.end())
        s += fmt::format(" | {:>10} {:>11} {:>10}", "-", "-", "-");
      else
        s += fmt::format(" | {:>10.3e} {:>11.1f} {:>10.0f}", it->rel_l2, it->us_per_layer, it->tokens_per_s);
    }
    s += "\n";
  }
  return s;
}

DemoResult run_demo(const DemoOptions& opt) {
  DemoResult res;
  res.shape = synthetic_shape(opt.shape);
  res.tokens = opt.tokens;
  if (opt.tokens < 1) throw Error(fmt::format("demo: --tokens must be >= 1, got {}", opt.tokens));
  const SyntheticShape& sh = res.shape;
  const int T = opt.tokens, H = sh.hidden;

  const bool temp = opt.out_dir.empty();
  const fs::path work = temp ? fs::temp_directory_path() / fmt::format("qmoe-demo-{}", static_cast<long>(getpid()))
                             : fs::path(opt.out_dir) / "checkpoints";
  const fs::path table_dir = temp ? fs::path("demo-out") : fs::path(opt.out_dir);
  struct Cleanup {
    fs::path p;
    bool on;
    ~Cleanup() {
      std::error_code ec;
      if (on) fs::remove_all(p, ec);
    }
  } cleanup{work, temp};
  fs::create_directories(work);
  fs::create_directories(table_dir);

  if (opt.cpu) res.devices.push_back("cpu");
  for (const auto& d : opt.devices) res.devices.push_back(d.name);
  if (res.devices.empty()) throw Error("demo: no device to run on");

  // ---- the synthetic model, its inputs and the unquantized fp32 reference ------------------
  if (opt.progress)
    status_line(fmt::format("qmoe demo: writing a synthetic {} layer (H={}, I={}, E={}, K={}) to {}", sh.model_type,
                            H, sh.inter, sh.experts, sh.top_k, work.string()));
  const fs::path src = work / "source";
  write_synthetic_checkpoint(src.string(), sh, opt.seed);
  const std::vector<float> x = synthetic_hidden_states(T, H, opt.seed);
  {
    Tensor hs = Tensor::zeros(DType::BF16, {T, H});
    auto* p = hs.mutable_data_as<uint16_t>();
    for (size_t i = 0; i < x.size(); ++i) p[i] = bf16_encode(x[i]);
    write_safetensors((work / "calib.safetensors").string(), {{"hidden_states", hs}});
  }
  MoELayerOptions ref_opt;
  ref_opt.kernel = Kernel::Reference;
  ref_opt.threads = opt.threads;
  const int moe_layer = ModelConfig::load(src.string()).moe_layers.front();
  const MoELayer ref_layer = MoELayer::from_checkpoint(src.string(), moe_layer, ref_opt);
  MoEWorkspace ws;
  ref_layer.plan_from_hidden(x.data(), T, ws);
  std::vector<float> ref(static_cast<size_t>(T) * H);
  ref_layer.run(x.data(), ws, ref.data());

  // ---- every scheme -------------------------------------------------------------------------
  const auto schemes = all_schemes();
  Progress prog("qmoe demo", schemes.size(), opt.progress);
  size_t idx = 0;
  for (const auto& s : schemes) {
    ++idx;
    DemoRow row;
    row.scheme = std::string(s.name);
    row.bits_per_weight = s.bits_per_weight;
    try {
      if (opt.progress) status_line(fmt::format("qmoe demo: [{}/{}] {}", idx, schemes.size(), s.name));
      const fs::path dst = work / std::string(s.name);
      QuantizeOptions qo;
      qo.threads = opt.threads;
      qo.progress = false;
      if (act_is_static(s.act)) qo.calib_path = (work / "calib.safetensors").string();
      quantize_checkpoint(src.string(), dst.string(), s, qo);
      row.checkpoint_mb = static_cast<double>(dir_safetensors_bytes(dst)) / 1e6;

      MoELayerOptions lo;
      lo.kernel = Kernel::Reference;
      lo.threads = opt.threads;
      MoELayer layer = MoELayer::from_checkpoint(dst.string(), moe_layer, lo);
      if (layer.experts().scheme == nullptr || layer.experts().scheme->name != s.name)
        throw Error(fmt::format("the quantized checkpoint loads as scheme {}, expected {}",
                                layer.experts().scheme ? layer.experts().scheme->name : "?", s.name));
      MoEWorkspace lws;
      layer.plan_from_hidden(x.data(), T, lws);
      if (lws.topk_ids != ws.topk_ids) throw Error("routing differs from the unquantized layer's");
      // Kernel check: the optimized CPU kernel against the scalar reference (the spec) on the first
      // few tokens of the same quantized layer.
      {
        const int tc = std::min(T, kCheckTokens);
        MoEWorkspace cws;
        layer.plan_from_hidden(x.data(), tc, cws);
        std::vector<float> r_out(static_cast<size_t>(tc) * H), o_out(r_out.size());
        layer.run(x.data(), cws, r_out.data());
        layer.set_kernel(Kernel::Optimized);
        layer.run(x.data(), cws, o_out.data());
        row.kernel_check = rel_l2(o_out, r_out);
        if (!(row.kernel_check <= kKernelCheckTolerance))
          throw Error(fmt::format("the optimized CPU kernel differs from the reference kernel by rel L2 {:.3e} (> {})",
                                  row.kernel_check, kKernelCheckTolerance));
      }
      if (opt.cpu) row.devices.push_back(measure("cpu", cpu_runner(layer), x, lws, ref, opt.repeats, T));
      for (const auto& d : opt.devices) {
        const DemoRunner run = d.prepare(layer, T, sh.top_k);
        row.devices.push_back(measure(d.name, run, x, lws, ref, opt.repeats, T));
      }
      if (s.method != Method::Unquantized && !(row.devices.front().rel_l2 > 0.0))
        throw Error("the quantized layer reproduces the unquantized output exactly: was anything quantized?");
    } catch (const std::exception& e) {
      row.ok = false;
      row.error = e.what();
      if (opt.progress) status_line(fmt::format("qmoe demo: {} FAILED: {}", s.name, e.what()));
    }
    res.rows.push_back(std::move(row));
    prog.add(1);
  }
  prog.finish();

  // ---- CSV + JSON ---------------------------------------------------------------------------
  std::string csv =
      "scheme,bits_per_weight,checkpoint_mb,kernel_check_rel_l2,device,rel_l2,us_per_layer,tokens_per_s,status\n";
  nlohmann::json j;
  j["shape"] = {{"name", sh.name}, {"model_type", sh.model_type}, {"hidden", sh.hidden}, {"inter", sh.inter},
                {"experts", sh.experts}, {"top_k", sh.top_k}};
  j["tokens"] = T;
  j["devices"] = res.devices;
  j["rows"] = nlohmann::json::array();
  for (const auto& r : res.rows) {
    nlohmann::json jr = {{"scheme", r.scheme},         {"bits_per_weight", r.bits_per_weight},
                         {"checkpoint_mb", r.checkpoint_mb}, {"kernel_check_rel_l2", r.kernel_check},
                         {"ok", r.ok},                  {"error", r.error}};
    jr["devices"] = nlohmann::json::object();
    for (const auto& d : r.devices) {
      jr["devices"][d.device] = {{"rel_l2", d.rel_l2}, {"us_per_layer", d.us_per_layer}, {"tokens_per_s", d.tokens_per_s}};
      csv += fmt::format("{},{},{:.4f},{:.3e},{},{:.6e},{:.2f},{:.1f},ok\n", r.scheme, r.bits_per_weight,
                         r.checkpoint_mb, r.kernel_check, d.device, d.rel_l2, d.us_per_layer, d.tokens_per_s);
    }
    if (!r.ok) {
      std::string err = r.error;
      std::replace(err.begin(), err.end(), ',', ';');
      std::replace(err.begin(), err.end(), '\n', ' ');
      csv += fmt::format("{},{},{:.4f},{:.3e},,,,,FAILED: {}\n", r.scheme, r.bits_per_weight, r.checkpoint_mb,
                         r.kernel_check, err);
    }
    j["rows"].push_back(std::move(jr));
  }
  res.csv_path = (table_dir / "demo.csv").string();
  res.json_path = (table_dir / "demo.json").string();
  write_file(res.csv_path, csv);
  write_file(res.json_path, j.dump(2) + "\n");
  return res;
}

}  // namespace qmoe
