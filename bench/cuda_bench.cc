// bench_cuda: the GPU benchmarks with their historical arguments and CSV, for outside tools that
// run it directly. The engine is the benchmark face's CUDA runner (src/bench/cuda/bench_cuda.cc),
// which `qmoe bench --device cuda` also runs (users: the CLI; `make gpu-check` runs the CLI).
// Prints a table last; --out writes CSV (columns shape,scheme,T,U,us,GBps,TFLOPps,floor_us,bound,
// pct_floor,vllm_bf16_us,vllm_int8_us,vllm_fp8_us, then added ones).
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>

#include "bench/bench.h"

int main(int argc, char** argv) {
  qmoe::bench::Options o;
  o.device = "cuda";
  o.shapes = qmoe::bench::kStandardShapes;
  // "+bf16act": CudaOptions::bf16_activations (vLLM's bf16 activations for weight-only schemes).
  o.schemes = "w_mxfp4,w_mxfp4+bf16act,w_mxfp4_a_mxfp4,nvfp4,w_int8_channel_a_int8_dyn_token,"
              "w_fp8_channel_a_fp8_dyn_token,unquantized,unquantized+bf16act";
  o.tokens = "1,16,64,256,1024,4096";
  o.reps = 20;
  std::string out_csv;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value after %s\n", a.c_str());
        std::exit(1);
      }
      return argv[++i];
    };
    try {
      if (a == "--shapes") o.shapes = next();
      else if (a == "--schemes") o.schemes = next();
      else if (a == "--tokens") o.tokens = next();
      else if (a == "--reps") o.reps = std::stoi(next());
      else if (a == "--out") out_csv = next();
      else if (a == "--copies") o.copies = std::stoi(next());
      else if (a == "--bf16-act") o.bf16_act = true;
      else if (a == "--token-tile") o.token_tile = std::stoi(next());
      else if (a == "--no-anchor") o.anchor = false;
      else if (a == "--help") {
        std::printf("bench_cuda [--shapes a,b] [--schemes x,y] [--tokens 1,16] [--reps N] [--copies R] [--out file.csv] "
                    "[--bf16-act] [--token-tile 8|16|64|128] [--no-anchor]\n"
                    "(the same engine as `qmoe bench --device cuda`)\n");
        return 0;
      } else {
        std::fprintf(stderr, "unknown argument %s (try --help)\n", a.c_str());
        return 1;
      }
    } catch (const std::logic_error&) {  // std::stoi: not an integer / out of range
      std::fprintf(stderr, "%s: expected an integer\n", a.c_str());
      return 1;
    }
  }
  try {
    const qmoe::bench::Plan plan = qmoe::bench::resolve(o);
    const qmoe::bench::Report r = qmoe::bench::run_cuda(plan);
    if (!out_csv.empty()) qmoe::bench::write_csv(out_csv, r);
    qmoe::bench::print_table(r);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
