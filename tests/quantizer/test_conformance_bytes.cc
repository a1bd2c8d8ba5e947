// quantize_linear reproduces the conformance cases' quantized weight tensors byte for byte from
// their unquantized `source/` checkpoints (conformance/README.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "qmoe/quantizer.h"
#include "qmoe/safetensors.h"
#include "qmoe/schemes.h"

namespace qmoe {
namespace {

const std::string kCases = QMOE_SOURCE_DIR "/../shared/conformance/cases/";

std::string case_scheme(const std::string& c) {
  std::ifstream in(kCases + c + "/case.json");
  return nlohmann::json::parse(in).at("scheme").get<std::string>();
}

// Index of the first differing byte, or -1.
int64_t first_diff(const Tensor& a, const Tensor& b) {
  const size_t n = std::min(a.nbytes(), b.nbytes());
  for (size_t i = 0; i < n; ++i)
    if (a.data_as<uint8_t>()[i] != b.data_as<uint8_t>()[i]) return static_cast<int64_t>(i);
  return a.nbytes() == b.nbytes() ? -1 : static_cast<int64_t>(n);
}

class ConformanceBytes : public ::testing::TestWithParam<std::string> {};

TEST_P(ConformanceBytes, WeightTensorsMatch) {
  const std::string c = GetParam();
  const SchemeInfo& scheme = scheme_by_name(case_scheme(c));
  auto src = SafetensorsFile::open(kCases + c + "/source/model.safetensors");
  auto ref = SafetensorsFile::open(kCases + c + "/model.safetensors");
  int linears = 0, compared = 0;
  for (const auto& info : src->tensors()) {
    const std::string& name = info.name;
    if (name.find(".experts.") == std::string::npos || name.size() < 7 || name.substr(name.size() - 7) != ".weight")
      continue;
    const std::string prefix = name.substr(0, name.size() - 7);
    const Tensor w = src->get(name);
    ASSERT_EQ(w.ndim(), 2) << name;
    const auto wf = to_f32(w, name);
    LinearQuantOptions opt;
    opt.input_amax = 1.0f;  // input scales are not compared (they depend on calibration)
    // NVFP4: gate_proj and up_proj of an expert share weight_scale_2 (Quark shared_scale_groups).
    const auto slash = prefix.rfind('.');
    const std::string proj = prefix.substr(slash + 1);
    if (scheme.weight == WeightFormat::Nvfp4 && (proj == "gate_proj" || proj == "up_proj")) {
      float amax = 0;
      for (const char* p : {".gate_proj.weight", ".up_proj.weight"})
        for (float v : to_f32(src->get(prefix.substr(0, slash) + p))) amax = std::max(amax, std::fabs(v));
      opt.weight_amax = amax;
    }
    const auto q = quantize_linear(prefix, wf.data(), w.dim(0), w.dim(1), scheme, opt);
    ++linears;
    for (const auto& t : q) {
      const bool weight_tensor = t.name == prefix + ".weight" || t.name == prefix + ".weight_scale" ||
                                 t.name == prefix + ".weight_scale_2";
      if (!weight_tensor) continue;
      const Tensor r = ref->get(t.name);
      EXPECT_EQ(r.dtype(), t.tensor.dtype()) << t.name;
      EXPECT_EQ(r.shape(), t.tensor.shape()) << t.name;
      const int64_t d = first_diff(t.tensor, r);
      EXPECT_EQ(d, -1) << t.name << ": first differing byte " << d << " (ours "
                       << (d >= 0 && size_t(d) < t.tensor.nbytes() ? int(t.tensor.data_as<uint8_t>()[d]) : -1)
                       << ", case " << (d >= 0 && size_t(d) < r.nbytes() ? int(r.data_as<uint8_t>()[d]) : -1) << ")";
      ++compared;
    }
  }
  EXPECT_GT(linears, 0);
  EXPECT_GE(compared, 2 * linears);
}

INSTANTIATE_TEST_SUITE_P(Cases, ConformanceBytes,
                         ::testing::Values("edge_topk_all_qwen3_nvfp4", "gpt_oss_w_mxfp4_bias", "qwen3_w_mxfp4_a_mxfp4",
                                           "qwen3_w_mxfp6_e3m2_a_mxfp6_e3m2"));

}  // namespace
}  // namespace qmoe
