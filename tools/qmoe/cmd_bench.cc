// qmoe bench — time one MoE layer's expert computation on random weights of a standard shape, on
// the CPU or the GPU (--device cpu | cuda). A thin client of the benchmark face (src/bench/bench.h),
// which holds the method: weight copies rotated beyond the last-level cache / L2, the read
// bandwidth measured by this command, the performance.md §4 floors, and the JSON / SVG / CSV.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "bench/bench.h"
#include "cli_checks.h"
#include "commands.h"
#include "qmoe/error.h"
#include "util/files.h"

namespace qmoe::cli {

void register_bench(CLI::App& app) {
  auto opt = std::make_shared<bench::Options>();
  auto json = std::make_shared<bool>(false);
  auto plot = std::make_shared<std::string>();
  auto csv = std::make_shared<std::string>();
  auto json_out = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("bench", "Benchmark one MoE layer's experts on random weights (CPU or CUDA kernels)");
  // Later occurrences win, so scripts can append overrides (scripts/gpu_check.sh BENCH_ARGS).
  sub->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  sub->add_option("--device", opt->device, "cpu | cuda")->capture_default_str();
  sub->add_option("--shape,--shapes", opt->shapes,
                  "Shapes, comma separated: mixtral-8x7b, deepseek-v3, qwen3-30b-a3b, gpt-oss-120b, gpt-oss-20b, tiny, small")
      ->capture_default_str();
  sub->add_option("--scheme,--schemes", opt->schemes,
                  "Schemes, comma separated (names or aliases of `qmoe schemes`; all: every scheme). CUDA variants: "
                  "+bf16act (CPU and CUDA), +xbf16, +route, +nowg, +f8mma, +tileN, +ksN suffixes")
      ->capture_default_str();
  sub->add_option("--tokens", opt->tokens, "Token counts, comma separated")->capture_default_str();
  sub->add_option("--threads", opt->threads, "CPU threads (0: all cores)")->capture_default_str();
  sub->add_flag("--json", *json, "Print a JSON array instead of the table");
  sub->add_option("--plot", *plot, "Write an SVG plot (µs per layer and % of bandwidth vs tokens)");
  sub->add_option("--csv,--out", *csv, "Write bench_cuda's CSV columns (shape,scheme,T,U,us,GBps,TFLOPps,floor_us,...)");
  sub->add_option("--json-out", *json_out, "Also write the JSON array to this file (the table still prints)");
  sub->add_option("--kernel", opt->kernel, "CPU: optimized | reference")->capture_default_str();
  sub->add_option("--reps", opt->reps, "Timed repetitions per point, median reported (default: 5 CPU, 20 CUDA)");
  sub->add_option("--experts", opt->experts, "Override the number of experts E (to fit memory)");
  sub->add_option("--max-weight-gb", opt->max_weight_gb,
                  "Refuse layers whose expert weights exceed this (0: 8 on the CPU, 40 on CUDA)")
      ->capture_default_str();
  sub->add_option("--seed", opt->seed, "Random seed")->capture_default_str();
  sub->add_option("--peak-tflops", opt->peak_tflops,
                  "Compute peak for the floor (CUDA default: 790 / 1580 per scheme; CPU: none)");
  sub->add_option("--copies", opt->copies, "CUDA: weight copies per graph (0: enough to touch >= 256 MB and 4 x L2)");
  sub->add_flag("--bf16-act", opt->bf16_act, "Every scheme with +bf16act (activations and intermediate rounded to bf16 once; CPU and CUDA)");
  sub->add_option("--token-tile", opt->token_tile, "CUDA: tokens per GEMM tile (8, 16, 32, 64, 128; 0: auto)");
  sub->add_flag("--no-anchor{false}", opt->anchor, "CUDA: skip the cuBLAS bf16 grouped-GEMM anchor");
  sub->add_option("--probe-gib", opt->probe_gib, "CUDA: read-bandwidth probe size in GiB (>= 4)")->capture_default_str();
  sub->add_option("--ep", opt->ep, "CUDA: expert-parallel ranks over this node's GPUs (NCCL); tokens per EP rank");
  sub->add_option("--tp", opt->tp, "CUDA: tensor-parallel ranks per EP rank");
  sub->callback([opt, json, plot, csv, json_out, sub] {
    bench::Options o = *opt;
    if (sub->count("--reps") == 0) o.reps = o.device == "cuda" ? 20 : 5;
    if (o.device == "cpu") o.threads = bounded_threads(o.threads);
    o.distributed = sub->count("--ep") + sub->count("--tp") > 0;
    const bench::Plan plan = bench::resolve(o);
    if (o.distributed) {
      if (*json || !json_out->empty() || !plot->empty())
        throw Error("--ep / --tp print a table (and --csv); --json, --json-out and --plot are for one GPU");
      bench::run_distributed(plan, *csv);
      return;
    }
    const bench::Report r = bench::run(plan);
    if (*json) fmt::print("{}\n", bench::to_json(r).dump(2));
    else bench::print_table(r);
    if (!json_out->empty()) {
      util::write_file_atomic(*json_out, bench::to_json(r).dump(2) + "\n");
      fmt::print(stderr, "qmoe bench: wrote {}\n", *json_out);
    }
    if (!csv->empty()) {
      bench::write_csv(*csv, r);
      fmt::print(stderr, "qmoe bench: wrote {}\n", *csv);
    }
    if (!plot->empty()) {
      bench::write_svg(*plot, r);
      fmt::print(stderr, "qmoe bench: wrote {}\n", *plot);
    }
  });
}

}  // namespace qmoe::cli
