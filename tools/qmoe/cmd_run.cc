// qmoe run MODEL_DIR --layer L --input IN.safetensors -o OUT.safetensors [--device cpu]
//          [--kernel reference|optimized] [--threads N] [--tp-rank r --tp-size n] [--ep-rank r --ep-size n]
// Runs one MoE layer. Input: `hidden_states` [T, H] BF16 or F32 and optionally `router_logits`
// [T, E] F32 (else the logits are computed with the checkpoint's router weight). Output:
// `output` [T, H] F32 (this rank's partial sum under TP / EP), `topk_ids` [T, K] I32,
// `topk_weights` [T, K] F32, written atomically (nothing is written on error).
#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "qmoe/config.h"
#include "qmoe/error.h"
#include "qmoe/moe.h"
#include "qmoe/moe_input.h"
#include "qmoe/safetensors.h"
#include "util/files.h"
#ifdef QMOE_HAVE_CUDA
#include "qmoe/cuda.h"
#endif

namespace qmoe::cli {

namespace {

struct RunOptions {
  std::string dir;
  std::optional<int> layer;  // absent: the first MoE layer
  std::string input, output;
  std::string device = "cpu";
  std::string kernel = "optimized";
  int threads = 0;
  int tp_rank = 0, tp_size = 1, ep_rank = 0, ep_size = 1;
};

void check_rank(const char* what, int rank, int size) {
  if (size < 1) throw Error(fmt::format("--{}-size must be at least 1, got {}", what, size));
  if (rank < 0 || rank >= size)
    throw Error(fmt::format("--{}-rank {} is outside [0, {}) (--{}-size {})", what, rank, size, what, size));
}

void run_command(const RunOptions& o) {
  // Every option is checked before any file is read.
  check_rank("tp", o.tp_rank, o.tp_size);
  check_rank("ep", o.ep_rank, o.ep_size);
  if (o.device == "cuda") {
#ifdef QMOE_HAVE_CUDA
    if (!cuda::available()) throw Error("--device cuda: no CUDA device is visible; use --device cpu");
#else
    throw Error("--device cuda: this qmoe was built without CUDA (configure with -DQMOE_CUDA=ON); use --device cpu");
#endif
  }
  const int threads = bounded_threads(o.threads);
  if (o.layer) check_layer_index(*o.layer);
  util::check_output_file(o.output, "-o/--output");

  // The input: read (not mapped), every value checked finite.
  const MoEInput input = read_moe_input(*SafetensorsFile::read(o.input));
  const int64_t T = input.tokens, H = input.hidden;
  const std::vector<float>& hidden = input.hidden_states;

  int layer_index = 0;
  if (o.layer) {
    layer_index = *o.layer;
  } else {
    const ModelConfig cfg = ModelConfig::load(o.dir);
    layer_index = cfg.moe_layers.empty() ? 0 : cfg.moe_layers.front();
  }
  MoELayerOptions opt;
  opt.load.tp_rank = o.tp_rank;
  opt.load.tp_size = o.tp_size;
  opt.load.ep_rank = o.ep_rank;
  opt.load.ep_size = o.ep_size;
  opt.kernel = o.kernel == "reference" ? Kernel::Reference : Kernel::Optimized;
  opt.threads = threads;
#ifdef QMOE_HAVE_CUDA
  if (o.device == "cuda") opt.runner = [](const ExpertsArgs& a) { cuda::experts_cuda(a); };
#endif
  const MoELayer layer = MoELayer::from_checkpoint(o.dir, layer_index, opt);
  if (H != layer.experts().hidden)
    throw Error(fmt::format("input {}: 'hidden_states' has hidden size {}; layer {} of {} has hidden_size {}", o.input,
                            H, layer_index, o.dir, layer.experts().hidden));

  MoEWorkspace ws;
  const int E = layer.config().num_experts;
  if (input.router_logits) {
    if (input.logit_cols != E)
      throw Error(fmt::format("input {}: 'router_logits' is F32 [{}, {}]; expected F32 [{}, {}] (layer {} of {} has {} "
                              "experts)",
                              o.input, T, input.logit_cols, T, E, layer_index, o.dir, E));
    layer.plan(input.router_logits->data(), static_cast<int>(T), ws);
  } else {
    if (!layer.has_router())
      throw Error(fmt::format("input {} has no 'router_logits' and layer {} of {} has no router weight ({})", o.input,
                              layer_index, o.dir, layer.config().router_weight_name(layer_index)));
    layer.plan_from_hidden(hidden.data(), static_cast<int>(T), ws);
  }

  std::vector<float> out(static_cast<size_t>(T) * static_cast<size_t>(H));
  layer.run(hidden.data(), ws, out.data());

  const int64_t K = ws.K;
  Tensor ids = Tensor::zeros(DType::I32, {T, K});
  std::memcpy(ids.mutable_data(), ws.topk_ids.data(), ws.topk_ids.size() * sizeof(int32_t));
  write_safetensors(o.output, {{"output", Tensor::from_f32(out, {T, H})},
                               {"topk_ids", ids},
                               {"topk_weights", Tensor::from_f32(ws.topk_weights, {T, K})}});
  fmt::print("layer {} ({}, {}): {} tokens, top-{} of {} experts, kernel {}{} -> {}\n", layer_index,
             layer.experts().scheme->name, layer.config().model_type, T, K, E, o.device == "cuda" ? std::string("cuda") : o.kernel,
             o.tp_size > 1 || o.ep_size > 1
                 ? fmt::format(", tp {}/{}, ep {}/{} (partial output)", o.tp_rank, o.tp_size, o.ep_rank, o.ep_size)
                 : std::string(),
             o.output);
}

}  // namespace

void register_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  auto* sub = app.add_subcommand("run", "Run one MoE layer of a checkpoint on hidden states from a safetensors file");
  sub->add_option("model_dir", o->dir, "checkpoint directory (config.json + safetensors)")->required();
  sub->add_option("--layer", o->layer, "decoder layer index (default: the first MoE layer)");
  sub->add_option("-i,--input", o->input,
                  "input safetensors: hidden_states [T, H] BF16/F32, optional router_logits [T, E] F32")
      ->required();
  sub->add_option("-o,--output", o->output, "output safetensors: output [T, H] F32, topk_ids, topk_weights")
      ->required();
  sub->add_option("--device", o->device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--kernel", o->kernel, "reference | optimized (CPU)")
      ->check(CLI::IsMember({"reference", "optimized"}));
  sub->add_option("--threads", o->threads, "CPU threads (0 = all cores)");
  sub->add_option("--tp-rank", o->tp_rank, "tensor-parallel rank");
  sub->add_option("--tp-size", o->tp_size, "tensor-parallel size");
  sub->add_option("--ep-rank", o->ep_rank, "expert-parallel rank");
  sub->add_option("--ep-size", o->ep_size, "expert-parallel size");
  sub->callback([o] { run_command(*o); });
}

}  // namespace qmoe::cli
