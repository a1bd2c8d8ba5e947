// verify_case: run one conformance case (conformance/README.md) and judge it.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "qmoe/error.h"
#include "qmoe/quantizer.h"
#include "util/files.h"
#include "util/json.h"

namespace qmoe {

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const fs::path& p) {
  return util::parse_json_limited<nlohmann::json>(
      util::read_regular_file(p.string(), "case description", util::kMaxJsonFileBytes), p.string());
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

const char* kernel_name(Kernel k) { return k == Kernel::Reference ? "reference" : "optimized"; }

}  // namespace

std::vector<std::string> expand_case_dirs(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const auto& a : args) {
    const fs::path p(a);
    if (fs::is_regular_file(p / "case.json")) {
      out.push_back(a);
      continue;
    }
    if (!fs::is_directory(p)) throw Error(fmt::format("verify: {} is not a case directory (no case.json)", a));
    std::vector<std::string> sub;
    for (const auto& e : fs::directory_iterator(p))
      if (e.is_directory() && fs::is_regular_file(e.path() / "case.json")) sub.push_back(e.path().string());
    if (sub.empty()) throw Error(fmt::format("verify: {} has no case.json and no case subdirectories", a));
    std::sort(sub.begin(), sub.end());
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<VerifyRow> verify_case(const std::string& dir, const VerifyOptions& opt) {
  const fs::path d(dir);
  const nlohmann::json cj = read_json(d / "case.json");
  const std::string name = cj.value("name", d.filename().string());
  const std::string case_scheme = cj.value("scheme", std::string());
  std::vector<VerifyRow> rows;

  // Kernels to run: the CPU kernels, or the device runner.
  std::vector<std::pair<std::string, std::optional<Kernel>>> runs;
  if (opt.runner)
    runs.emplace_back(opt.device, std::nullopt);
  else
    for (Kernel k : opt.kernels) runs.emplace_back(kernel_name(k), k);
  if (runs.empty()) throw Error("verify: no kernel selected");

  auto load_and_run = [&](std::optional<Kernel> k, std::optional<MoELayer>& holder, std::vector<float>& out,
                          MoEWorkspace& ws, const std::vector<float>& x, const std::vector<float>& logits, int T,
                          const LoadOptions& load = {}) {
    MoELayerOptions lo;
    lo.kernel = k.value_or(Kernel::Reference);
    lo.threads = opt.threads;
    lo.load = load;
    if (!k) lo.runner = opt.runner;
    const int layer_idx = ModelConfig::load(dir).moe_layers.front();
    holder.emplace(MoELayer::from_checkpoint(dir, layer_idx, lo));
    holder->plan(logits.data(), T, ws);
    out.assign(static_cast<size_t>(T) * holder->experts().hidden, 0.0f);
    holder->run(x.data(), ws, out.data());
  };

  if (cj.value("expect_error", false)) {
    VerifyRow r;
    r.case_name = name;
    r.scheme = case_scheme.empty() ? "-" : case_scheme;
    r.kernel = runs.front().first;
    r.device = opt.device;
    std::vector<std::string> keywords;
    for (const auto& k : cj.value("error_keywords", nlohmann::json::array())) keywords.push_back(lower(k.get<std::string>()));
    try {
      std::vector<float> x, logits, out;
      int T = 1;
      if (fs::is_regular_file(d / "io.safetensors")) {
        try {
          const auto io = SafetensorsFile::open((d / "io.safetensors").string());
          x = to_f32(io->get("hidden_states"));
          logits = to_f32(io->get("router_logits"));
          T = static_cast<int>(io->get("hidden_states").dim(0));
        } catch (const Error&) {
          x.clear();
        }
      }
      std::optional<MoELayer> layer;
      MoEWorkspace ws;
      if (x.empty()) {
        // No usable inputs: loading alone must fail.
        MoELayerOptions lo;
        MoELayer::from_checkpoint(dir, ModelConfig::load(dir).moe_layers.front(), lo);
      } else {
        load_and_run(runs.front().second, layer, out, ws, x, logits, T);
      }
      r.pass = false;
      r.message = "expected an error, but loading and running succeeded";
    } catch (const std::exception& e) {
      const std::string msg = e.what();
      const std::string lm = lower(msg);
      bool hit = keywords.empty();
      for (const auto& k : keywords) hit = hit || lm.find(k) != std::string::npos;
      r.pass = hit;
      r.message = hit ? msg : fmt::format("error message lacks every keyword of {}: {}", cj["error_keywords"].dump(), msg);
    }
    rows.push_back(std::move(r));
    return rows;
  }

  const auto io = SafetensorsFile::open((d / "io.safetensors").string());
  const Tensor hs = io->get("hidden_states");
  const int T = static_cast<int>(hs.dim(0));
  const std::vector<float> x = to_f32(hs, "hidden_states");
  const std::vector<float> logits = to_f32(io->get("router_logits"), "router_logits");
  const std::vector<float> expected = to_f32(io->get("expected"), "expected");
  const Tensor ids_t = io->get("topk_ids");
  if (hs.ndim() != 2 || T < 1) throw Error(fmt::format("{}: io.safetensors 'hidden_states' must be [T, H]", dir));
  const std::vector<float> ids_f = to_f32(ids_t, "topk_ids");
  const double tol_loose = cj.at("tolerance_rel_l2").get<double>();
  const double tol_tight = cj.at("tolerance_rel_l2_fp32").get<double>();

  // One evaluation: load with `load`, plan the case's router logits, run, compare with `want`.
  struct Eval {
    std::string scheme;
    double rel = 0, agree = 0;
    std::vector<std::string> why;
  };
  auto evaluate = [&](std::optional<Kernel> kernel, const LoadOptions& load, const std::vector<float>& want) {
    Eval ev;
    std::optional<MoELayer> layer;
    MoEWorkspace ws;
    std::vector<float> out;
    load_and_run(kernel, layer, out, ws, x, logits, T, load);
    const SchemeInfo* s = layer->experts().scheme;
    ev.scheme = s ? std::string(s->name) : "?";
    size_t same = 0;
    const size_t n = std::min(ws.topk_ids.size(), ids_f.size());
    for (size_t i = 0; i < n; ++i) same += static_cast<float>(ws.topk_ids[i]) == ids_f[i];
    ev.agree = ids_f.empty() ? 0.0 : 100.0 * static_cast<double>(same) / static_cast<double>(ids_f.size());
    double num = 0, den = 0;
    bool finite = out.size() == want.size();
    for (size_t i = 0; finite && i < out.size(); ++i) {
      if (!std::isfinite(out[i])) finite = false;
      const double dd = static_cast<double>(out[i]) - want[i];
      num += dd * dd;
      den += static_cast<double>(want[i]) * want[i];
    }
    ev.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    if (!case_scheme.empty() && ev.scheme != case_scheme)
      ev.why.push_back(fmt::format("loaded as scheme {}, the case is {}", ev.scheme, case_scheme));
    if (same != ids_f.size() || ws.topk_ids.size() != ids_f.size())
      ev.why.push_back(fmt::format("top-k ids differ ({:.2f}% agree)", ev.agree));
    if (!finite) ev.why.push_back("output has non-finite values or the wrong size");
    if (den == 0) ev.why.push_back("expected output is all zero");
    return ev;
  };
  auto tolerance_for = [&](std::optional<Kernel> kernel, const std::string& scheme) {
    const SchemeInfo* s = find_scheme(scheme);
    const bool act_q = s && act_is_quantized(s->act);
    return (kernel && *kernel == Kernel::Reference) || act_q ? tol_tight : tol_loose;
  };
  auto finish = [](VerifyRow& r, std::vector<std::string> why) {
    if (!(r.rel_l2 <= r.tolerance)) why.push_back(fmt::format("rel_l2 {:.3e} > tolerance {:.3e}", r.rel_l2, r.tolerance));
    r.pass = why.empty();
    for (const auto& w : why) r.message += (r.message.empty() ? "" : "; ") + w;
  };

  // Tensor- / expert-parallel partial outputs the case carries (expected_{tp,ep}2_rank<r>).
  std::vector<std::pair<LoadOptions, std::string>> parallel;
  for (int rank = 0; rank < 2; ++rank) {
    LoadOptions tp;
    tp.tp_rank = rank;
    tp.tp_size = 2;
    LoadOptions ep;
    ep.ep_rank = rank;
    ep.ep_size = 2;
    if (io->find(fmt::format("expected_tp2_rank{}", rank))) parallel.emplace_back(tp, fmt::format("expected_tp2_rank{}", rank));
    if (io->find(fmt::format("expected_ep2_rank{}", rank))) parallel.emplace_back(ep, fmt::format("expected_ep2_rank{}", rank));
  }

  for (const auto& [label, kernel] : runs) {
    VerifyRow r;
    r.case_name = name;
    r.scheme = case_scheme;
    r.kernel = label;
    r.device = opt.device;
    try {
      const Eval ev = evaluate(kernel, {}, expected);
      r.scheme = ev.scheme;
      r.routing_agreement = ev.agree;
      r.rel_l2 = ev.rel;
      r.tolerance = tolerance_for(kernel, ev.scheme);
      finish(r, ev.why);
    } catch (const std::exception& e) {
      r.pass = false;
      r.message = e.what();
    }
    rows.push_back(std::move(r));

    if (parallel.empty()) continue;
    // One row for all parallel ranks: the worst rel_l2 of the partial outputs.
    VerifyRow p;
    p.case_name = name;
    p.scheme = rows.back().scheme;
    p.kernel = label + " tp/ep2";
    p.device = opt.device;
    try {
      std::vector<std::string> why;
      p.routing_agreement = 100.0;
      for (const auto& [load, tensor] : parallel) {
        const Eval ev = evaluate(kernel, load, to_f32(io->get(tensor), tensor));
        p.rel_l2 = std::max(p.rel_l2, ev.rel);
        p.routing_agreement = std::min(p.routing_agreement, ev.agree);
        p.tolerance = tolerance_for(kernel, ev.scheme);
        for (const auto& w : ev.why) why.push_back(tensor + ": " + w);
        if (!(ev.rel <= p.tolerance)) why.push_back(fmt::format("{}: rel_l2 {:.3e}", tensor, ev.rel));
      }
      finish(p, why);
    } catch (const std::exception& e) {
      p.pass = false;
      p.message = e.what();
    }
    rows.push_back(std::move(p));
  }
  return rows;
}

std::string verify_table(const std::vector<VerifyRow>& rows) {
  std::string s = fmt::format("{:<38} {:<34} {:<17} {:>10} {:>10} {:>8}  {}\n", "case", "scheme", "kernel", "rel_l2",
                              "tolerance", "routing", "result");
  s += std::string(129, '-') + "\n";
  int passed = 0, failed = 0;
  for (const auto& r : rows) {
    const std::string rel = r.rel_l2 < 0 ? "-" : fmt::format("{:.3e}", r.rel_l2);
    const std::string tol = r.tolerance < 0 ? "-" : fmt::format("{:.3e}", r.tolerance);
    const std::string rt = r.routing_agreement < 0 ? "-" : fmt::format("{:.1f}%", r.routing_agreement);
    s += fmt::format("{:<38} {:<34} {:<17} {:>10} {:>10} {:>8}  {}\n", r.case_name, r.scheme, r.kernel, rel, tol, rt,
                     r.pass ? "PASS" : "FAIL");
    if (!r.pass) {
      s += fmt::format("    {}\n", r.message);
    } else if (r.rel_l2 < 0 && !r.message.empty()) {  // an error case: show the error it raised
      std::string m = r.message.substr(0, r.message.find('\n'));
      if (m.size() > 110) m = m.substr(0, 107) + "...";
      s += fmt::format("    expected error: {}\n", m);
    }
    (r.pass ? passed : failed)++;
  }
  s += fmt::format("{} passed, {} failed\n", passed, failed);
  return s;
}

}  // namespace qmoe
