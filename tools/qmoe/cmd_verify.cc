// qmoe verify: run conformance cases and print a pass/fail table.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "qmoe/error.h"
#include "qmoe/quantizer.h"
#ifdef QMOE_HAVE_CUDA
#include "qmoe/cuda.h"
#endif

namespace qmoe::cli {

void register_verify(CLI::App& app) {
  struct Args {
    std::vector<std::string> cases;
    std::string device = "cpu", kernel = "both";
    int threads = 0;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand("verify", "Run conformance cases (directories with case.json, or a folder of them)");
  sub->add_option("cases", args->cases, "case directories, or directories holding case directories")->required();
  sub->add_option("--device", args->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--kernel", args->kernel, "CPU kernel: reference, optimized or both")
      ->check(CLI::IsMember({"reference", "optimized", "both"}));
  sub->add_option("--threads", args->threads, "CPU threads (default: all cores)");
  sub->callback([args] {
    VerifyOptions opt;
    opt.threads = bounded_threads(args->threads);
    opt.device = args->device;
    if (args->kernel == "reference") opt.kernels = {Kernel::Reference};
    if (args->kernel == "optimized") opt.kernels = {Kernel::Optimized};
    if (args->device == "cuda") {
#ifdef QMOE_HAVE_CUDA
      if (!cuda::available()) throw Error("verify --device cuda: no CUDA device is visible");
      opt.runner = [](const ExpertsArgs& a) { cuda::experts_cuda(a); };
#else
      throw Error("verify --device cuda: this qmoe was built without CUDA (configure with -DQMOE_CUDA=ON)");
#endif
    }
    std::vector<VerifyRow> rows;
    for (const auto& dir : expand_case_dirs(args->cases)) {
      auto r = verify_case(dir, opt);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    fmt::print("{}", verify_table(rows));
    for (const auto& r : rows)
      if (!r.pass) throw CLI::RuntimeError(1);
  });
}

}  // namespace qmoe::cli
