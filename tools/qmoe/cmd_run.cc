// qmoe run MODEL_DIR --layer L --input IN.safetensors -o OUT.safetensors [--device cpu]
//          [--kernel reference|optimized] [--threads N] [--tp-rank r --tp-size n] [--ep-rank r --ep-size n]
//          [--ep N --tp M [--devices cuda:0,cuda:1,...] [--dispatch all-to-all|all-gather]]
// Runs one MoE layer. Input: `hidden_states` [T, H] BF16 or F32 and optionally `router_logits`
// [T, E] F32 (else the logits are computed with the checkpoint's router weight). Output:
// `output` [T, H] F32 (this rank's partial sum under --tp-rank / --ep-rank; the whole layer under
// --ep / --tp, which run every rank in this process: EP ranks take contiguous chunks of the
// tokens, TP ranks of one EP rank the same chunk; on the CPU over the in-process group, on GPUs over
// NCCL, rank w = e·tp + t on the w-th listed device), `topk_ids` [T, K] I32, `topk_weights` [T, K]
// F32, written atomically (nothing is written on error).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "qmoe/config.h"
#include "qmoe/dist.h"
#include "qmoe/error.h"
#include "qmoe/moe.h"
#include "qmoe/moe_input.h"
#include "qmoe/safetensors.h"
#include "util/files.h"
#ifdef QMOE_HAVE_CUDA
#include "qmoe/cuda.h"
#include "qmoe/cuda_dist.h"
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
  int ep = 1, tp = 1;            // run all ranks of this layout here
  std::string devices;           // "cuda:0,cuda:1" (with --ep / --tp)
  std::string dispatch = "all-to-all";
};

// "cuda:0,cuda:1" → {0, 1}; `n` devices are needed (empty: cuda:0 .. n−1).
std::vector<int> parse_devices(const std::string& list, int n) {
  std::vector<int> out;
  if (list.empty()) {
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string item = list.substr(pos, comma - pos);
    int idx = -1;
    if (item.rfind("cuda:", 0) == 0 && item.size() > 5 && item.find_first_not_of("0123456789", 5) == std::string::npos)
      idx = std::stoi(item.substr(5));
    if (idx < 0)
      throw Error(fmt::format("--devices: '{}' is not a device; expected a comma-separated list like cuda:0,cuda:1",
                              item));
    if (std::find(out.begin(), out.end(), idx) != out.end())
      throw Error(fmt::format("--devices lists cuda:{} twice; NCCL needs one GPU per rank", idx));
    out.push_back(idx);
    pos = comma + 1;
  }
  if (static_cast<int>(out.size()) != n)
    throw Error(fmt::format("--devices lists {} devices; --ep x --tp = {} ranks need one each", out.size(), n));
  return out;
}

// Every rank of an ep × tp layout on its own thread; out [T, H] is the whole layer's output.
void run_all_ranks(const RunOptions& o, int layer_index, const std::vector<float>& hidden, const float* logits,
                   int T, int E, std::vector<float>& out, std::vector<int32_t>& ids, std::vector<float>& weights,
                   int& K, std::string& scheme_name, int& hidden_size) {
  const dist::DistOptions dopt{o.ep, o.tp,
                               o.dispatch == "all-gather" ? dist::ExpertDispatch::AllGather
                                                          : dist::ExpertDispatch::AllToAll};
  const int world = o.ep * o.tp;
  const bool cuda = o.device == "cuda";
  std::vector<int> devices;
  if (cuda) devices = parse_devices(o.devices, world);
  // Communicators: one per EP row (same tp rank) and per TP column (same ep rank).
  const dist::RankLayout lay{o.ep, o.tp};
  std::vector<std::vector<std::unique_ptr<dist::Communicator>>> ep_groups(static_cast<size_t>(o.tp)),
      tp_groups(static_cast<size_t>(o.ep));
  auto make = [&](const std::vector<int>& members) {
#ifdef QMOE_HAVE_CUDA
    if (cuda) {
      std::vector<int> devs;
      for (int w : members) devs.push_back(devices[static_cast<size_t>(w)]);
      return cuda::nccl_communicators(devs);
    }
#endif
    return dist::make_in_process_group(static_cast<int>(members.size()));
  };
  for (int t = 0; t < o.tp; ++t) ep_groups[static_cast<size_t>(t)] = make(lay.ep_group(t));
  for (int e = 0; e < o.ep; ++e) tp_groups[static_cast<size_t>(e)] = make(lay.tp_group(e * o.tp));
  // Tokens: contiguous chunks per EP rank, the first T % ep ranks one more.
  auto chunk = [&](int e) {
    const int base = T / o.ep, rem = T % o.ep;
    const int b = e * base + std::min(e, rem);
    return std::pair<int, int>{b, b + base + (e < rem ? 1 : 0)};
  };
  ids.assign(static_cast<size_t>(T) * K, 0);
  weights.assign(static_cast<size_t>(T) * K, 0.0f);
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  std::mutex mu;
  for (int w = 0; w < world; ++w)
    threads.emplace_back([&, w] {
      try {
        const int e = lay.ep_rank(w), t = lay.tp_rank(w);
        dist::Communicator& epc = *ep_groups[static_cast<size_t>(t)][static_cast<size_t>(e)];
        dist::Communicator& tpc = *tp_groups[static_cast<size_t>(e)][static_cast<size_t>(t)];
        const auto [b, en] = chunk(e);
        const int n = en - b;
        const float* x = n ? hidden.data() + static_cast<size_t>(b) * hidden_size : nullptr;
        const float* lg = n && logits ? logits + static_cast<size_t>(b) * E : nullptr;
        std::vector<float> part(static_cast<size_t>(n) * hidden_size);
        MoEWorkspace ws;
        const MoELayer* layer = nullptr;
        std::unique_ptr<dist::DistributedMoE> cpu_layer;
#ifdef QMOE_HAVE_CUDA
        std::unique_ptr<cuda::CudaDistributedMoE> gpu_layer;
        if (cuda) {
          cuda::CudaOptions copt;
          copt.device = devices[static_cast<size_t>(w)];
          gpu_layer = std::make_unique<cuda::CudaDistributedMoE>(o.dir, layer_index, epc, tpc, dopt, copt);
          gpu_layer->forward_host(x, lg, n, ws, part.data());
          layer = &gpu_layer->layer();
        }
#endif
        if (!cuda) {
          MoELayerOptions base;
          base.kernel = o.kernel == "reference" ? Kernel::Reference : Kernel::Optimized;
          const int threads = bounded_threads(o.threads);
          const unsigned hc = std::thread::hardware_concurrency();
          base.threads = std::max(1, (threads > 0 ? threads : static_cast<int>(hc == 0 ? 1 : hc)) / world);
          cpu_layer = std::make_unique<dist::DistributedMoE>(o.dir, layer_index, epc, tpc, dopt, base);
          cpu_layer->forward(x, lg, n, ws, part.data());
          layer = &cpu_layer->layer();
        }
        if (t != 0) return;  // every TP rank holds the same rows
        std::lock_guard<std::mutex> lock(mu);
        if (w == 0) scheme_name = layer->experts().scheme->name;
        std::copy(part.begin(), part.end(), out.begin() + static_cast<ptrdiff_t>(b) * hidden_size);
        std::copy(ws.topk_ids.begin(), ws.topk_ids.end(), ids.begin() + static_cast<ptrdiff_t>(b) * ws.K);
        std::copy(ws.topk_weights.begin(), ws.topk_weights.end(), weights.begin() + static_cast<ptrdiff_t>(b) * ws.K);
      } catch (const std::exception& ex) {
        errors[static_cast<size_t>(w)] = ex.what();
      }
    });
  for (auto& th : threads) th.join();
  // The first rank's own error, not the "another rank gave up" echoes of it.
  for (const std::string& e : errors)
    if (!e.empty() && e.find("gave up") == std::string::npos) throw Error(e);
  for (const std::string& e : errors)
    if (!e.empty()) throw Error(e);
}

void check_rank(const char* what, int rank, int size) {
  if (size < 1) throw Error(fmt::format("--{}-size must be at least 1, got {}", what, size));
  if (rank < 0 || rank >= size)
    throw Error(fmt::format("--{}-rank {} is outside [0, {}) (--{}-size {})", what, rank, size, what, size));
}

void run_command(const RunOptions& o) {
  // Every option is checked before any file is read.
  check_rank("tp", o.tp_rank, o.tp_size);
  check_rank("ep", o.ep_rank, o.ep_size);
  const bool all_ranks = o.ep > 1 || o.tp > 1 || !o.devices.empty();
  if (o.ep < 1 || o.tp < 1) throw Error(fmt::format("--ep and --tp must be at least 1, got --ep {} --tp {}", o.ep, o.tp));
  if (all_ranks && (o.tp_size > 1 || o.ep_size > 1))
    throw Error("--ep / --tp (run every rank here) and --ep-size / --tp-size (one rank's partial output) exclude each "
                "other");
  if (!o.devices.empty() && o.device != "cuda")
    throw Error("--devices lists GPUs; add --device cuda (or leave --devices out to run the ranks on the CPU)");
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
  if (all_ranks) {
    const ModelConfig cfg = ModelConfig::load(o.dir);
    const int E = cfg.num_experts;
    dist::validate_layout({o.ep, o.tp, dist::ExpertDispatch::AllToAll}, E);
    if (H != cfg.hidden_size)
      throw Error(fmt::format("input {}: 'hidden_states' has hidden size {}; {} has hidden_size {}", o.input, H, o.dir,
                              cfg.hidden_size));
    if (input.router_logits && input.logit_cols != E)
      throw Error(fmt::format("input {}: 'router_logits' is F32 [{}, {}]; expected F32 [{}, {}] ({} has {} experts)",
                              o.input, T, input.logit_cols, T, E, o.dir, E));
    std::vector<float> out(static_cast<size_t>(T) * static_cast<size_t>(H));
    std::vector<int32_t> ids;
    std::vector<float> weights;
    int K = cfg.top_k, hs = static_cast<int>(H);
    std::string scheme_name;
    run_all_ranks(o, layer_index, hidden, input.router_logits ? input.router_logits->data() : nullptr,
                  static_cast<int>(T), E, out, ids, weights, K, scheme_name, hs);
    Tensor tids = Tensor::zeros(DType::I32, {T, K});
    std::memcpy(tids.mutable_data(), ids.data(), ids.size() * sizeof(int32_t));
    write_safetensors(o.output, {{"output", Tensor::from_f32(out, {T, H})},
                                 {"topk_ids", tids},
                                 {"topk_weights", Tensor::from_f32(weights, {T, K})}});
    fmt::print("layer {} ({}): {} tokens, top-{} of {} experts, {} ranks (ep {} x tp {}, {}, {}) -> {}\n",
               layer_index, scheme_name, T, K, E, o.ep * o.tp, o.ep, o.tp, o.dispatch,
               o.device == "cuda" ? "NCCL" : "CPU in-process", o.output);
    return;
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
  sub->add_option("--ep", o->ep, "run all ranks here: expert-parallel ranks (tokens split among them)");
  sub->add_option("--tp", o->tp, "run all ranks here: tensor-parallel ranks per EP rank");
  sub->add_option("--devices", o->devices, "GPUs of the ranks with --device cuda, e.g. cuda:0,cuda:1 (default cuda:0..)");
  sub->add_option("--dispatch", o->dispatch, "EP token exchange: all-to-all (default) | all-gather (the baseline)")
      ->check(CLI::IsMember({"all-to-all", "all-gather"}));
  sub->callback([o] { run_command(*o); });
}

}  // namespace qmoe::cli
