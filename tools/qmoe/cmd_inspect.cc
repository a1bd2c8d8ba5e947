// qmoe inspect MODEL_DIR [--json] [--layer L ...]
// The architecture, and per MoE layer the resolved scheme (and how it matched), the sizes and the
// parameter table of the loaded + processed experts (and shared expert), totals, exclusions and
// warnings. --json prints the same report as one JSON object.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "qmoe/inspect.h"

namespace qmoe::cli {

namespace {

using Json = nlohmann::ordered_json;

struct InspectOptions {
  std::string dir;
  bool json = false;
  std::vector<int> layers;
};

std::string shape_text(const Json& s) {
  std::vector<int64_t> v = s.get<std::vector<int64_t>>();
  return fmt::format("[{}]", fmt::join(v, ", "));
}

void print_experts(const Json& j, const std::string& indent) {
  fmt::print("{}scheme       {} ({}): {} weights, {} scales, {} activations\n", indent, j["scheme"].get<std::string>(),
             j["method"].get<std::string>(), j["weights"].get<std::string>(), j["weight_scale"].get<std::string>(),
             j["activations"].get<std::string>());
  fmt::print("{}matched by   {}{}\n", indent, j["matched_by"].get<std::string>(),
             j["excluded"].get<bool>() ? " (excluded: unquantized)" : "");
  fmt::print("{}sizes        E {} (local {}), H {}, I {} (per rank {})\n", indent, j["num_experts"].get<int>(),
             j["num_local"].get<int>(), j["hidden"].get<int>(), j["intermediate"].get<int>(),
             j["intermediate_per_rank"].get<int>());
  if (j.contains("act_scale_mode"))
    fmt::print("{}MX act rule  {}\n", indent, j["act_scale_mode"].get<std::string>());
  if (j.contains("a13_scale"))
    fmt::print("{}static       a13 {}, a2 {} ({})\n", indent, j["a13_scale"].get<float>(), j["a2_scale"].get<float>(),
               j["static_scale_meaning"].get<std::string>());
  fmt::print("{}parameters   {:<24} {:<18} {:<8} {:>12}\n", indent, "name", "shape", "dtype", "bytes");
  for (const Json& r : j["params"])
    fmt::print("{}             {:<24} {:<18} {:<8} {:>12}\n", indent, r["name"].get<std::string>(),
               shape_text(r["shape"]), r["dtype"].get<std::string>(), r["bytes"].get<int64_t>());
  fmt::print("{}total        {} bytes, {:.3f} bits/weight\n", indent, j["total_bytes"].get<int64_t>(),
             j["bits_per_weight"].get<double>());
}

void print_text(const Json& r) {
  const Json& a = r["architecture"];
  fmt::print("model        {}\n", r["model_dir"].get<std::string>());
  fmt::print("architecture {}: H {}, I {}, E {}, top-k {}, {} layers (MoE layers: {})\n", a["model_type"].get<std::string>(),
             a["hidden_size"].get<int>(), a["moe_intermediate_size"].get<int>(), a["num_experts"].get<int>(),
             a["top_k"].get<int>(), a["num_layers"].get<int>(),
             fmt::join(a["moe_layers"].get<std::vector<int>>(), ", "));
  fmt::print("activation   {}{}{}\n", a["activation"].get<std::string>(), a["expert_bias"].get<bool>() ? ", expert biases" : "",
             a.contains("swiglu_limit") ? fmt::format(", limit {}", a["swiglu_limit"].get<float>()) : "");
  fmt::print("routing      {}\n", a["routing_text"].get<std::string>());
  fmt::print("naming       {}\n", a["naming"].get<std::string>());
  const Json& q = r["quantization"];
  if (q.is_null())
    fmt::print("quantization none (no quark quantization_config)\n");
  else
    fmt::print("quantization quark {} (exclude: {})\n", q["version"].get<std::string>(),
               fmt::join(q["exclude"].get<std::vector<std::string>>(), ", "));
  for (const Json& l : r["layers"]) {
    fmt::print("\nlayer {}      {} (top-k {})\n", l["layer"].get<int>(), l["prefix"].get<std::string>(),
               l["top_k"].get<int>());
    print_experts(l, "  ");
    if (l.contains("shared_expert")) {
      fmt::print("  shared expert {}\n", l["shared_expert"]["prefix"].get<std::string>());
      print_experts(l["shared_expert"], "    ");
    }
  }
  fmt::print("\nexcluded     {}\n", r["excluded"].empty() ? "none" : "");
  for (const Json& e : r["excluded"])
    fmt::print("  layer {} {}: {}\n", e["layer"].get<int>(), e["prefix"].get<std::string>(), e["reason"].get<std::string>());
  fmt::print("warnings     {}\n", r["warnings"].empty() ? "none" : "");
  for (const Json& w : r["warnings"]) fmt::print("  {}\n", w.get<std::string>());
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  auto* sub = app.add_subcommand("inspect", "Show a checkpoint's MoE layers: schemes, how they matched, parameters");
  sub->add_option("model_dir", o->dir, "checkpoint directory (config.json + safetensors)")->required();
  sub->add_flag("--json", o->json, "print the report as JSON");
  sub->add_option("--layer", o->layers, "only these MoE layers (repeatable; default: all)");
  sub->callback([o] {
    const std::string report = inspect_report_json(o->dir, o->layers, 2);
    if (o->json)
      fmt::print("{}\n", report);
    else
      print_text(Json::parse(report));
  });
}

}  // namespace qmoe::cli
