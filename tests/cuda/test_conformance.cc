// Every non-error conformance case (shared/conformance/cases) through the loader + MoELayer and
// the CUDA experts, with the case's routing, against `expected` at tolerance_rel_l2_fp32; the
// weight-only / unquantized cases also in the bf16-activation mode at tolerance_rel_l2; and the
// TP / EP partial outputs where a case has them.
#include <gtest/gtest.h>

#include "cpu/conformance_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "params_builder.h"
#include "qmoe/cuda.h"
#include "qmoe/moe.h"
#include "qmoe/safetensors.h"

namespace qmoe::cuda::test {
namespace {

namespace fs = std::filesystem;
const std::string kCases = conformance::cases_dir();

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
// A number field of case.json (flat key), NaN when absent.
double json_number(const std::string& text, const std::string& key) {
  const std::regex re("\"" + key + "\"\\s*:\\s*([-+0-9.eE]+)");
  std::smatch m;
  return std::regex_search(text, m, re) ? std::stod(m[1].str()) : NAN;
}
bool json_true(const std::string& text, const std::string& key) {
  return std::regex_search(text, std::regex("\"" + key + "\"\\s*:\\s*true"));
}

std::vector<std::string> case_names() {
  std::vector<std::string> v;
  if (!fs::exists(kCases)) return v;
  for (const auto& d : fs::directory_iterator(kCases))
    if (d.is_directory() && fs::exists(d.path() / "case.json") && !json_true(read_text(d.path() / "case.json"), "expect_error"))
      v.push_back(d.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

// Routed experts on the GPU (+ `start`, e.g. the shared expert's output) for the case's routing.
std::vector<float> run_case(const MoELayer& layer, const SafetensorsFile& io, const std::vector<float>& start,
                            const CudaOptions& opt) {
  const std::vector<float> x = to_f32(io.get("hidden_states"), "hidden_states");
  const Tensor ids_t = io.get("topk_ids");
  const std::vector<float> w = to_f32(io.get("topk_weights"), "topk_weights");
  const int T = static_cast<int>(ids_t.dim(0)), K = static_cast<int>(ids_t.dim(1));
  std::vector<int32_t> ids(ids_t.data_as<int32_t>(), ids_t.data_as<int32_t>() + T * K);
  std::vector<float> out = start.empty() ? std::vector<float>(x.size(), 0.0f) : start;
  ExpertsArgs a;
  a.params = &layer.experts();
  a.x = x.data();
  a.T = T;
  a.K = K;
  a.topk_ids = ids.data();
  a.topk_weights = w.data();
  a.router_weight_on_input = layer.config().routing.apply_router_weight_on_input;
  a.out = out.data();
  experts_cuda(a, opt);
  return out;
}

class CudaConformance : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaConformance, MatchesExpected) {
  if (!qmoe::cuda::available()) GTEST_SKIP() << "no CUDA device";
  const fs::path dir = fs::path(kCases) / GetParam();
  const std::string cj = read_text(dir / "case.json");
  const double tol32 = json_number(cj, "tolerance_rel_l2_fp32");
  const double tol = json_number(cj, "tolerance_rel_l2");
  ASSERT_TRUE(std::isfinite(tol32)) << "case.json has no tolerance_rel_l2_fp32";
  const auto io = SafetensorsFile::open((dir / "io.safetensors").string());
  const std::vector<float> expected = to_f32(io->get("expected"), "expected");
  std::vector<float> shared;
  if (io->find("shared_expert_output")) shared = to_f32(io->get("shared_expert_output"), "shared_expert_output");

  const MoELayer layer = MoELayer::from_checkpoint(dir.string(), 0);
  const std::vector<float> out = run_case(layer, *io, shared, {});
  const double r = rel_l2(out, expected);
  EXPECT_LE(r, tol32) << GetParam() << " (fp32-accurate path)";
  RecordProperty("rel_l2", std::to_string(r));

  if (!act_is_quantized(layer.experts().scheme->act) && std::isfinite(tol)) {
    CudaOptions o;
    o.bf16_activations = true;
    const double rb = rel_l2(run_case(layer, *io, shared, o), expected);
    EXPECT_LE(rb, tol) << GetParam() << " (bf16 activations)";
  }
  // Tensor- and expert-parallel partial outputs.
  for (const char* kind : {"tp", "ep"})
    for (int rank = 0; rank < 2; ++rank) {
      const std::string name = std::string("expected_") + kind + "2_rank" + std::to_string(rank);
      if (!io->find(name)) continue;
      MoELayerOptions mo;
      if (kind[0] == 't') {
        mo.load.tp_size = 2;
        mo.load.tp_rank = rank;
      } else {
        mo.load.ep_size = 2;
        mo.load.ep_rank = rank;
      }
      const MoELayer part = MoELayer::from_checkpoint(dir.string(), 0, mo);
      const std::vector<float> want = to_f32(io->get(name), name);
      const double rp = rel_l2(run_case(part, *io, {}, {}), want);
      EXPECT_LE(rp, tol32) << GetParam() << " " << name;
    }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaConformance, ::testing::ValuesIn(case_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaConformance);

}  // namespace
}  // namespace qmoe::cuda::test
