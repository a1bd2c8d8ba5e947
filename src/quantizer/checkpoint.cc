// quantize_checkpoint: an unquantized HF MoE checkpoint → the same model with its expert linears
// quantized as Quark exports them (checkpoint-format.md §1–§6). Streams shard by shard.
#include <fcntl.h>
#include <stdio.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "qmoe/config.h"
#include "qmoe/error.h"
#include "qmoe/quantizer.h"
#include "qmoe/safetensors.h"
#include "quantizer/calibration.h"
#include "quantizer/names.h"
#include "quantizer/parallel.h"
#include "quantizer/progress.h"
#include "util/files.h"
#include "util/json.h"

namespace qmoe {

namespace fs = std::filesystem;
using namespace quantizer_detail;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";

std::string read_text(const fs::path& p) {
  return util::read_regular_file(p.string(), "model config", util::kMaxJsonFileBytes);
}

void write_text(const fs::path& p, const std::string& text) { util::write_file_atomic(p.string(), text); }

uint64_t info_bytes(const TensorInfo& t) {
  return static_cast<uint64_t>((shape_numel(t.shape) * dtype_bits(t.dtype) + 7) / 8);
}

bool is_float_dtype(DType d) { return d == DType::BF16 || d == DType::F16 || d == DType::F32; }

// One expert linear of the source and what happens to it.
struct Job {
  ExpertLinear lin;
  bool quantize = false;
  std::string partner;          // NVFP4 gate/up: the other projection's weight tensor (shared global scale)
  std::optional<float> input_amax;
};

// One source tensor and the output tensors it becomes.
struct Item {
  std::string name;
  int job = -1;                 // index into jobs when it is a quantized expert weight
  std::vector<TensorInfo> outs;
  uint64_t bytes = 0;
};

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Layer indices that appear in the source tensor names ("model.layers.L.").
std::set<int> layers_in(const std::vector<std::string>& names) {
  constexpr std::string_view kPrefix = "model.layers.";
  std::set<int> out;
  for (const auto& n : names) {
    if (n.rfind(kPrefix, 0) != 0) continue;
    const size_t dot = n.find('.', kPrefix.size());
    if (dot == std::string::npos) continue;
    const std::string_view idx(n.data() + kPrefix.size(), dot - kPrefix.size());
    if (all_digits(idx) && idx.size() < 9) out.insert(std::stoi(std::string(idx)));
  }
  return out;
}

// "model.safetensors" or "model-00001-of-00003.safetensors".
bool is_model_shard_name(std::string_view n) {
  if (n == "model.safetensors") return true;
  constexpr std::string_view kHead = "model-", kTail = ".safetensors";
  if (n.size() <= kHead.size() + kTail.size() || n.substr(0, kHead.size()) != kHead ||
      n.substr(n.size() - kTail.size()) != kTail)
    return false;
  const std::string_view mid = n.substr(kHead.size(), n.size() - kHead.size() - kTail.size());
  const size_t of = mid.find("-of-");
  return of != std::string_view::npos && all_digits(mid.substr(0, of)) && all_digits(mid.substr(of + 4));
}

// An existing output directory may hold only what quantize writes (shards, index, config.json and
// the files copied from the source): it is replaced as a whole, so anything else would be lost.
void check_replaceable_output(const fs::path& dst, const fs::path& src) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(dst, ec);
  if (ec || st.type() == fs::file_type::not_found) return;
  if (st.type() != fs::file_type::directory)
    throw Error(fmt::format("quantize: -o {} exists and is not a directory; expected a new or a previous output "
                            "directory",
                            dst.string()));
  std::set<std::string> ours{"config.json", kIndexName};
  for (const auto& e : fs::directory_iterator(src, ec))
    if (e.is_regular_file()) ours.insert(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(dst)) {
    const std::string n = e.path().filename().string();
    const bool known = ours.count(n) || is_model_shard_name(n);
    if (!known || e.is_directory())
      throw Error(fmt::format("quantize: -o {} already holds '{}', which quantize does not write; the output "
                              "directory is replaced as a whole, so choose a new or empty directory (or remove it)",
                              dst.string(), n));
  }
}

// Put the complete checkpoint `tmp` in place of `dst`: an atomic exchange when dst exists (the old
// one is then removed), a rename when it does not.
void swap_in(const fs::path& tmp, const fs::path& dst) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(dst, ec))) {
    if (::rename(tmp.c_str(), dst.c_str()) == 0) return;
    throw Error(fmt::format("quantize: cannot move the new checkpoint {} to {}: {}", tmp.string(), dst.string(),
                            std::strerror(errno)));
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dst.c_str(), RENAME_EXCHANGE) != 0) {
    // File systems without RENAME_EXCHANGE: move the old one aside first.
    const fs::path old = util::make_sibling_temp_dir(dst.string(), "qmoe-old");
    fs::remove(old);
    if (::rename(dst.c_str(), old.c_str()) != 0 || ::rename(tmp.c_str(), dst.c_str()) != 0)
      throw Error(fmt::format("quantize: cannot replace {} with the new checkpoint {}: {}", dst.string(),
                              tmp.string(), std::strerror(errno)));
    fs::remove_all(old, ec);
    return;
  }
  fs::remove_all(tmp, ec);  // now the old checkpoint
}

// Removes the temporary build directory unless the checkpoint was swapped in.
struct TempDirGuard {
  fs::path path;
  ~TempDirGuard() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

}  // namespace

std::vector<std::string> default_exclude_patterns(std::string_view model_type, const std::vector<std::string>& extra) {
  std::vector<std::string> v{"lm_head", "re:.*mlp.gate$"};
  if (model_type == "mixtral") v.emplace_back("re:.*block_sparse_moe.gate$");
  for (const char* p : {"re:.*router.*", "re:.*self_attn.*", "re:.*shared_expert_gate.*"}) v.emplace_back(p);
  for (const auto& e : extra)
    if (std::find(v.begin(), v.end(), e) == v.end()) v.push_back(e);
  return v;
}

QuantizeReport quantize_checkpoint(const std::string& src_dir, const std::string& dst_dir, const SchemeInfo& scheme,
                                   const QuantizeOptions& opt) {
  const int threads = resolve_threads(opt.threads);
  QuantizeReport report;
  std::error_code ec;
  if (!fs::is_directory(src_dir, ec))
    throw Error(fmt::format("quantize: source checkpoint directory {} does not exist", src_dir));
  if (fs::exists(dst_dir, ec) && fs::equivalent(src_dir, dst_dir, ec))
    throw Error(fmt::format("quantize: the output directory {} is the source directory", dst_dir));
  if (opt.shard_size == 0) throw Error("quantize: --shard-size must be > 0 bytes");
  const bool quantize = scheme.method != Method::Unquantized;
  if (quantize && act_is_static(scheme.act) && opt.calib_path.empty())
    throw Error(fmt::format("quantize: scheme {} has static activation scales ({}); give calibration data with "
                            "--calib CALIB.safetensors (tensor 'hidden_states' [N, H] or "
                            "'model.layers.L.hidden_states')",
                            scheme.name, to_string(scheme.act)));

  // ---- source config + tensors --------------------------------------------------------------
  if (dst_dir.empty()) throw Error("quantize: the output directory name is empty");
  const fs::path src(src_dir), dst(dst_dir);
  check_replaceable_output(dst, src);
  const ModelConfig cfg = ModelConfig::load(src_dir);  // validates config.json first (nesting, fields)
  const std::string cfg_text = read_text(src / "config.json");
  const nlohmann::json cfg_json =
      util::parse_json_limited<nlohmann::json>(cfg_text, (src / "config.json").string());
  if (cfg.quant)
    throw Error(fmt::format("quantize: {} already has a quantization_config; qmoe quantize needs an unquantized "
                            "(BF16 / F16 / F32) checkpoint",
                            (src / "config.json").string()));
  const Checkpoint ckpt = Checkpoint::open(src_dir);
  const std::vector<std::string> names = ckpt.names();

  // ---- exclude list and output config -------------------------------------------------------
  std::vector<std::string> exclude = default_exclude_patterns(cfg.model_type, {});
  const std::set<int> moe_layers(cfg.moe_layers.begin(), cfg.moe_layers.end());
  for (int l : layers_in(names)) {
    if (moe_layers.count(l)) continue;
    // Dense MLP layers (and extra layers such as DeepSeek's MTP layer) are copied unquantized.
    exclude.push_back(l < cfg.num_layers ? fmt::format("re:model\\.layers\\.{}\\.mlp\\..*", l)
                                         : fmt::format("re:model\\.layers\\.{}\\..*", l));
  }
  for (const auto& e : opt.exclude)
    if (std::find(exclude.begin(), exclude.end(), e) == exclude.end()) exclude.push_back(e);

  nlohmann::json out_json = cfg_json;
  ModelConfig out_cfg = cfg;
  if (quantize) {
    out_json["quantization_config"] = nlohmann::json::parse(quark_quantization_config_json(scheme, exclude));
    out_cfg = ModelConfig::parse(out_json.dump(), (dst / "config.json").string());
  }

  // ---- expert linears -----------------------------------------------------------------------
  std::vector<Job> jobs;
  std::map<std::string, size_t> job_of;  // weight tensor name → job
  auto add_linears = [&](const std::vector<ExpertLinear>& lins, const LayerScheme* ls) {
    const bool q = ls != nullptr && !ls->excluded;
    for (const auto& l : lins) {
      const std::string wname = l.prefix + ".weight";
      const TensorInfo* info = ckpt.info(wname);
      if (!q) {
        if (info) ++report.excluded_linears;
        continue;
      }
      if (!info)
        throw Error(fmt::format("quantize: expert weight '{}' not found in {} (expected per-expert Linear tensors "
                                "[{}, {}]; fused 3-D expert tensors are not supported)",
                                wname, src_dir, l.out, l.in));
      if (!is_float_dtype(info->dtype))
        throw Error(fmt::format("quantize: expert weight '{}' in {} has dtype {}; expected BF16, F16 or F32 (an "
                                "unquantized checkpoint)",
                                wname, ckpt.file_of(wname), dtype_name(info->dtype)));
      if (info->shape != Shape{l.out, l.in})
        throw Error(fmt::format("quantize: expert weight '{}' in {} has shape {}, expected {} from config.json",
                                wname, ckpt.file_of(wname), shape_str(info->shape), shape_str(Shape{l.out, l.in})));
      if (ls->scheme != &scheme && ls->scheme->name != scheme.name)
        throw Error(fmt::format("quantize: internal error: the written quantization_config resolves '{}' to scheme "
                                "{}, not {}",
                                l.prefix, ls->scheme->name, scheme.name));
      Job j;
      j.lin = l;
      j.quantize = true;
      job_of[wname] = jobs.size();
      jobs.push_back(std::move(j));
    }
  };
  std::vector<std::pair<int, bool>> calib_layers;  // (layer, has quantized shared expert)
  for (int layer : cfg.moe_layers) {
    if (!quantize) break;
    bool any_routed = false;
    const LayerScheme rs = resolve_moe_scheme(out_cfg, layer);
    if (rs.excluded) report.excluded_layers.push_back(fmt::format("{} ({})", cfg.experts_prefix(layer), rs.reason));
    const size_t before = jobs.size();
    for (int e = 0; e < cfg.num_experts; ++e) add_linears(routed_expert_linears(cfg, layer, e), &rs);
    any_routed = jobs.size() > before;
    bool shared_q = false;
    if (!cfg.shared_expert_prefix(layer).empty()) {
      const LayerScheme ss = resolve_shared_expert_scheme(out_cfg, layer);
      if (ss.excluded)
        report.excluded_layers.push_back(fmt::format("{} ({})", cfg.shared_expert_prefix(layer), ss.reason));
      const size_t b2 = jobs.size();
      add_linears(shared_expert_linears(cfg, layer), &ss);
      shared_q = jobs.size() > b2;
    }
    if (any_routed || shared_q) calib_layers.emplace_back(layer, shared_q);
  }
  // NVFP4: gate_proj / up_proj of one expert share weight_scale_2 (Quark's shared_scale_groups).
  if (scheme.weight == WeightFormat::Nvfp4)
    for (auto& j : jobs) {
      if (j.lin.role != ProjRole::Gate && j.lin.role != ProjRole::Up) continue;
      const std::string base = j.lin.prefix.substr(0, j.lin.prefix.rfind('.'));
      const auto projs = j.lin.expert < 0 ? std::vector<std::string>{"gate_proj", "up_proj", "down_proj"}
                                          : cfg.projection_names();
      j.partner = base + "." + projs[j.lin.role == ProjRole::Gate ? 1 : 0] + ".weight";
      if (!job_of.count(j.partner))
        throw Error(fmt::format("quantize: NVFP4 needs both gate and up projections; '{}' is missing", j.partner));
    }

  // ---- calibration (static activation scales) -----------------------------------------------
  if (quantize && act_is_static(scheme.act) && !jobs.empty()) {
    const auto calib = SafetensorsFile::read(opt.calib_path);
    Progress prog("qmoe quantize: calibrating", calib_layers.size(), opt.progress, opt.on_progress);
    for (const auto& [layer, shared_q] : calib_layers) {
      int tokens = 0;
      const auto x = calibration_inputs(*calib, layer, cfg.hidden_size, tokens);
      LayerCalibration cal = calibrate_layer(ckpt, cfg, layer, x, tokens, true, shared_q, threads);
      if (scheme.act == ActQuant::Nvfp4) {
        // sync_moe_expert_input_amax: every expert of the layer shares its input_scale_2.
        float m1 = 0, m2 = 0;
        for (const auto& a : cal.experts) m1 = std::max(m1, a.gemm1), m2 = std::max(m2, a.gemm2);
        for (auto& a : cal.experts) a.gemm1 = m1, a.gemm2 = m2;
      }
      auto assign = [&](const std::vector<ExpertLinear>& lins, const ExpertInputAmax& a) {
        for (const auto& l : lins) {
          auto it = job_of.find(l.prefix + ".weight");
          if (it == job_of.end()) continue;
          jobs[it->second].input_amax = l.role == ProjRole::Down ? a.gemm2 : a.gemm1;
        }
      };
      for (int e = 0; e < cfg.num_experts; ++e)
        assign(routed_expert_linears(cfg, layer, e), cal.experts[static_cast<size_t>(e)]);
      if (cal.shared) assign(shared_expert_linears(cfg, layer), *cal.shared);
      prog.add(1);
    }
    prog.finish();
  }

  // ---- plan the output tensors and shards ---------------------------------------------------
  std::vector<Item> items;
  items.reserve(names.size());
  uint64_t total_bytes = 0, total_params = 0;
  for (const auto& n : names) {
    Item it;
    it.name = n;
    auto jit = job_of.find(n);
    if (jit != job_of.end()) {
      const Job& j = jobs[jit->second];
      it.job = static_cast<int>(jit->second);
      it.outs = quantized_linear_layout(j.lin.prefix, j.lin.out, j.lin.in, scheme);
    } else {
      it.outs = {*ckpt.info(n)};
    }
    for (const auto& o : it.outs) {
      it.bytes += info_bytes(o);
      total_params += static_cast<uint64_t>(shape_numel(o.shape));
    }
    total_bytes += it.bytes;
    items.push_back(std::move(it));
  }
  std::vector<std::vector<size_t>> shards(1);
  uint64_t cur = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!shards.back().empty() && cur + items[i].bytes > opt.shard_size) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += items[i].bytes;
  }
  const size_t nshards = shards.size();

  // ---- write ---------------------------------------------------------------------------------
  // Into a fresh sibling directory, swapped in only once complete: a failure leaves dst as it was.
  if (dst.has_parent_path()) fs::create_directories(dst.parent_path());
  const fs::path out_dir = util::make_sibling_temp_dir(dst.string(), "qmoe-quantize");
  TempDirGuard guard{out_dir};
  std::map<std::string, std::string> weight_map;
  uint64_t src_total = 0;
  for (const auto& n : names) src_total += ckpt.info(n)->end - ckpt.info(n)->begin;
  Progress prog(fmt::format("qmoe quantize: {}", scheme.name), src_total, opt.progress, opt.on_progress);
  for (size_t s = 0; s < nshards; ++s) {
    const std::string fname = nshards == 1 ? std::string("model.safetensors")
                                           : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, nshards);
    const auto& idx = shards[s];
    std::vector<std::vector<NamedTensor>> results(idx.size());
    parallel_for(static_cast<int64_t>(idx.size()), threads, [&](int64_t k) {
      const Item& it = items[idx[static_cast<size_t>(k)]];
      const TensorInfo* info = ckpt.info(it.name);
      if (it.job < 0) {
        results[static_cast<size_t>(k)].push_back({it.name, ckpt.get(it.name)});
      } else {
        const Job& j = jobs[static_cast<size_t>(it.job)];
        const std::vector<float> w = to_f32(ckpt.get(it.name), it.name);
        LinearQuantOptions lo;
        lo.input_amax = j.input_amax;
        lo.threads = 1;
        if (!j.partner.empty()) {
          float amax = 0.0f;
          for (float v : w) amax = std::max(amax, std::fabs(v));
          for (float v : to_f32(ckpt.get(j.partner), j.partner)) amax = std::max(amax, std::fabs(v));
          lo.weight_amax = amax;
        }
        results[static_cast<size_t>(k)] = quantize_linear(j.lin.prefix, w.data(), j.lin.out, j.lin.in, scheme, lo);
      }
      prog.add(info->end - info->begin);
    });
    std::vector<NamedTensor> tensors;
    for (size_t k = 0; k < idx.size(); ++k) {
      const Item& it = items[idx[k]];
      if (it.job >= 0)
        ++report.quantized_linears;
      else
        ++report.copied_tensors;
      for (auto& t : results[k]) {
        weight_map[t.name] = fname;
        tensors.push_back(std::move(t));
      }
    }
    results.clear();
    write_safetensors((out_dir / fname).string(), tensors);
    report.files.push_back(fname);
  }
  prog.finish();
  report.shards = static_cast<int>(nshards);
  report.total_bytes = total_bytes;
  if (nshards > 1) {
    write_safetensors_index((out_dir / kIndexName).string(), weight_map, total_bytes, total_params);
    report.files.emplace_back(kIndexName);
  }
  write_text(out_dir / "config.json", out_json.dump(2) + "\n");
  report.files.emplace_back("config.json");

  // Other files of the source (generation_config.json, tokenizer files, ...).
  for (const auto& e : fs::directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    const std::string n = e.path().filename().string();
    if (n == "config.json" || n == kIndexName || e.path().extension() == ".safetensors") continue;
    fs::copy_file(e.path(), out_dir / n, fs::copy_options::overwrite_existing);
    report.files.push_back(n);
  }
  // mkdtemp made the directory 0700; give it the usual permissions before it becomes dst.
  fs::permissions(out_dir, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                               fs::perms::others_read | fs::perms::others_exec);
  util::sync_parent_dir((out_dir / "config.json").string());
  swap_in(out_dir, dst);
  guard.path.clear();
  util::sync_parent_dir(dst.string());
  return report;
}

}  // namespace qmoe
