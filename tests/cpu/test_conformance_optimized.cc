// Conformance with the optimized CPU kernels: every non-error case (error cases: the reference test) under shared/conformance/cases
// through MoELayer::from_checkpoint (Kernel::Optimized) + plan(router_logits) + run, on every ISA
// this CPU supports (env QMOE_CPU_ISA). Tolerance (conformance/README.md): tolerance_rel_l2_fp32
// for schemes that quantize activations (the kernels quantize from fp32 values), tolerance_rel_l2
// for weight-only and unquantized schemes. TP / EP partial outputs too.
#include <gtest/gtest.h>

#include "cpu/conformance_util.h"
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "cpu/isa.h"
#include "qmoe/error.h"
#include "qmoe/moe.h"
#include "qmoe/safetensors.h"
#include "qmoe/schemes.h"

namespace qmoe {
namespace {

namespace fs = std::filesystem;
using conformance::cases_dir;
using conformance::rel_l2;
std::vector<std::string> list_cases() { return conformance::list_cases(/*include_error_cases=*/false); }

// Sets QMOE_CPU_ISA for the scope.
struct IsaEnv {
  explicit IsaEnv(cpu::Isa isa) { setenv("QMOE_CPU_ISA", std::string(cpu::isa_name(isa)).c_str(), 1); }
  ~IsaEnv() { unsetenv("QMOE_CPU_ISA"); }
};

std::vector<float> run_layer(const std::string& dir, const LoadOptions& load, const std::vector<float>& hidden,
                             const std::vector<float>& logits, int T, int threads) {
  MoELayerOptions opt;
  opt.load = load;
  opt.kernel = Kernel::Optimized;
  opt.threads = threads;
  const MoELayer layer = MoELayer::from_checkpoint(dir, 0, opt);
  MoEWorkspace ws;
  layer.plan(logits.data(), T, ws);
  std::vector<float> out(static_cast<size_t>(T) * layer.experts().hidden, 0.0f);
  layer.run(hidden.data(), ws, out.data());
  return out;
}

class ConformanceOptimized : public ::testing::TestWithParam<std::string> {};

TEST_P(ConformanceOptimized, OptimizedKernel) {
  const std::string dir = cases_dir() + GetParam();
  std::ifstream jf(dir + "/case.json");
  const nlohmann::json c = nlohmann::json::parse(jf);
  const SchemeInfo* scheme = find_scheme(c.at("scheme").get<std::string>());
  ASSERT_NE(scheme, nullptr) << c.at("scheme");
  const bool act_quant = act_is_quantized(scheme->act);
  const double tol = act_quant ? c.at("tolerance_rel_l2_fp32").get<double>() : c.at("tolerance_rel_l2").get<double>();

  const auto io = SafetensorsFile::open(dir + "/io.safetensors");
  const Tensor hs = io->get("hidden_states");
  const int T = static_cast<int>(hs.dim(0));
  const std::vector<float> hidden = to_f32(hs);
  const std::vector<float> logits = to_f32(io->get("router_logits"));
  const std::vector<float> expected = to_f32(io->get("expected"));

  for (cpu::Isa isa : cpu::kAllIsas) {
    if (!cpu::isa_supported(isa)) continue;
    const IsaEnv env(isa);
    const std::vector<float> out = run_layer(dir, {}, hidden, logits, T, 2);
    bool nonzero = false;
    for (float f : out) {
      ASSERT_TRUE(std::isfinite(f)) << "non-finite output, isa " << cpu::isa_name(isa);
      nonzero = nonzero || f != 0.0f;
    }
    EXPECT_TRUE(nonzero) << "all-zero output, isa " << cpu::isa_name(isa);
    const double err = rel_l2(out, expected);
    std::cout << "[ conformance-optimized ] " << GetParam() << " (" << cpu::isa_name(isa) << "): rel_l2 = " << err
              << " (tolerance " << tol << (act_quant ? ", fp32 chain" : ", bf16 chain") << ")\n";
    EXPECT_LE(err, tol) << cpu::isa_name(isa);

    for (const char* kind : {"tp", "ep"}) {
      for (int rank = 0; rank < 2; ++rank) {
        const std::string name = std::string("expected_") + kind + "2_rank" + std::to_string(rank);
        if (io->find(name) == nullptr) continue;
        LoadOptions load;
        if (kind[0] == 't') load.tp_rank = rank, load.tp_size = 2;
        else load.ep_rank = rank, load.ep_size = 2;
        const double pe = rel_l2(run_layer(dir, load, hidden, logits, T, 3), to_f32(io->get(name)));
        EXPECT_LE(pe, tol) << name << " isa " << cpu::isa_name(isa);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ConformanceOptimized, ::testing::ValuesIn(list_cases()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace qmoe
