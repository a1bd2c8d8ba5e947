// qmoe dequant MODEL_DIR --layer L (--expert E | --shared) -o OUT.safetensors [--after-load]
//                [--tp-rank r --tp-size n]
// Writes the exactly dequantized weights of one expert as F32 tensors `w13` [2·I_p, H] (rows as
// stored: gate then up, or interleaved for gpt-oss) and `w2` [H, I_p]. Without --after-load the
// parameters are dequantized as loaded; with it after load-time processing (per-tensor w13
// requantization to max(s_w1, s_w3), NVFP4 global-scale merge).
#include <fmt/format.h>

#include <memory>
#include <string>

#include "cli_checks.h"
#include "commands.h"
#include "qmoe/config.h"
#include "qmoe/error.h"
#include "qmoe/params.h"
#include "qmoe/safetensors.h"
#include "util/files.h"

namespace qmoe::cli {

namespace {

struct DequantOptions {
  std::string dir;
  std::string out;
  int layer = -1;
  int expert = -1;
  bool shared = false;
  bool after_load = false;
  int tp_rank = 0;
  int tp_size = 1;
};

void run_dequant(const DequantOptions& o) {
  if ((o.expert >= 0) == o.shared)
    throw Error("dequant: give exactly one of --expert E (a global routed expert id) or --shared");
  check_layer_index(o.layer);
  if (o.tp_size < 1) throw Error(fmt::format("--tp-size must be at least 1, got {}", o.tp_size));
  if (o.tp_rank < 0 || o.tp_rank >= o.tp_size)
    throw Error(fmt::format("--tp-rank {} is outside [0, {}): tp_rank must be < tp_size (--tp-size {})", o.tp_rank,
                            o.tp_size, o.tp_size));
  util::check_output_file(o.out, "-o/--output");
  ModelConfig cfg = ModelConfig::load(o.dir);
  const Checkpoint ckpt = Checkpoint::open(o.dir);
  cfg.adapt_naming_to_checkpoint([&](const std::string& n) { return ckpt.has(n); });
  LoadOptions opt;
  opt.tp_rank = o.tp_rank;
  opt.tp_size = o.tp_size;
  ExpertParams p;
  if (o.shared) {
    p = load_shared_expert_params(ckpt, cfg, resolve_shared_expert_scheme(cfg, o.layer), o.layer, opt);
  } else {
    if (o.expert >= cfg.num_experts)
      throw Error(fmt::format("dequant: expert {} is out of range: layer {} has {} experts (ids 0..{})", o.expert,
                              o.layer, cfg.num_experts, cfg.num_experts - 1));
    // Load only the requested expert (it becomes local expert 0).
    opt.expert_map.assign(static_cast<size_t>(cfg.num_experts), -1);
    opt.expert_map[static_cast<size_t>(o.expert)] = 0;
    p = load_expert_params(ckpt, cfg, resolve_moe_scheme(cfg, o.layer), o.layer, opt);
  }
  if (o.after_load) process_expert_params(p);
  std::vector<float> w13, w2;
  dequant_expert(p, 0, w13, w2);
  const int64_t rows = p.rows13(), H = p.hidden, I = p.inter;
  const std::string which = o.shared ? std::string("shared") : std::to_string(o.expert);
  write_safetensors(o.out,
                    {{"w13", Tensor::from_f32(w13, {rows, H})}, {"w2", Tensor::from_f32(w2, {H, I})}},
                    {{"format", "pt"},
                     {"qmoe.scheme", std::string(p.scheme->name)},
                     {"qmoe.layer", std::to_string(o.layer)},
                     {"qmoe.expert", which},
                     {"qmoe.after_load", o.after_load ? "true" : "false"},
                     {"qmoe.tp", fmt::format("{}/{}", o.tp_rank, o.tp_size)}});
  fmt::print("wrote {}: w13 [{}, {}], w2 [{}, {}] F32 ({}, layer {}, expert {}, tp {}/{}, {})\n", o.out, rows, H, H, I,
             p.scheme->name, o.layer, which, o.tp_rank, o.tp_size,
             o.after_load ? "after load-time processing" : "as loaded");
}

}  // namespace

void register_dequant(CLI::App& app) {
  auto o = std::make_shared<DequantOptions>();
  auto* sub = app.add_subcommand(
      "dequant", "Write one expert's exactly dequantized weights (F32 w13 [2*I_p, H], w2 [H, I_p]) to safetensors");
  sub->add_option("model_dir", o->dir, "checkpoint directory (config.json + safetensors)")->required();
  sub->add_option("--layer", o->layer, "decoder layer index")->required();
  sub->add_option("--expert", o->expert, "global id of the routed expert")->check(CLI::NonNegativeNumber);
  sub->add_flag("--shared", o->shared, "dequantize the layer's shared expert instead of a routed one");
  sub->add_option("-o,--output", o->out, "output .safetensors file (written atomically)")->required();
  sub->add_flag("--after-load", o->after_load,
                "dequantize after load-time processing (w13 requantized to max(s_w1, s_w3), merged scales)");
  sub->add_option("--tp-rank", o->tp_rank, "tensor-parallel rank (default 0)");
  sub->add_option("--tp-size", o->tp_size, "tensor-parallel size (default 1)");
  sub->callback([o] { run_dequant(*o); });
}

}  // namespace qmoe::cli
