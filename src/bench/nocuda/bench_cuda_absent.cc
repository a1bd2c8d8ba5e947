// Built without CUDA: `--device cuda` is an error that says so (no crash, nonzero exit).
#include "bench/bench.h"
#include "qmoe/error.h"

namespace qmoe::bench {

bool cuda_built_in() { return false; }

Report run_cuda(const Plan&) {
  throw Error("--device cuda: CUDA is not built in (this qmoe was configured without the CUDA backend; rebuild "
              "with cmake -DQMOE_CUDA=ON on a machine with nvcc, e.g. `make gpu-check`)");
}

void run_distributed(const Plan& plan, const std::string&) { (void)run_cuda(plan); }

}  // namespace qmoe::bench
