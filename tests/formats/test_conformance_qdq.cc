// Cross-check of the activation quantize-dequantize rules against the golden conformance data:
// for every case whose GEMM1 input is quantized, io.safetensors holds `hidden_states` [T, H] BF16
// and `qdq_hidden_states` [T, H] F32 (the exact QDQ of the bf16 input, rows quantized along H).
// The formats.h block quantizers must reproduce it bit for bit (by value: −0 == +0, spec §16.9).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "qmoe/formats.h"
#include "qmoe/safetensors.h"

namespace qmoe {
namespace {

namespace fs = std::filesystem;

struct TestTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

TestTensor read_tensor(const SafetensorsFile& f, const std::string& name) {
  const Tensor t = f.get(name);
  return {t.shape(), to_f32(t, name)};
}

std::string cases_dir() { return std::string(QMOE_SOURCE_DIR) + "/../shared/conformance/cases/"; }

struct QdqCase {
  std::string name, rule;  // rule = activation_quant.gemm1_input
  nlohmann::json meta;
  TestTensor x, want;
};

std::vector<QdqCase> load_cases() {
  std::vector<QdqCase> out;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(cases_dir()))
    if (e.is_directory()) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (const auto& d : dirs) {
    std::ifstream f(d / "case.json");
    if (!f) continue;
    const auto meta = nlohmann::json::parse(f);
    if (!meta.contains("activation_quant") || !fs::exists(d / "io.safetensors")) continue;
    const std::string rule = meta["activation_quant"].value("gemm1_input", "none");
    if (rule == "none") continue;
    const auto io = SafetensorsFile::open((d / "io.safetensors").string());
    if (!io->find("qdq_hidden_states")) continue;
    out.push_back({d.filename().string(), rule, meta, read_tensor(*io, "hidden_states"),
                   read_tensor(*io, "qdq_hidden_states")});
  }
  return out;
}

const std::vector<QdqCase>& cases() {
  static const std::vector<QdqCase> c = load_cases();
  return c;
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
float arg_of(const std::string& rule) {  // "name(1.25)" → 1.25f (printed float32 values)
  const auto a = rule.find('('), b = rule.rfind(')');
  return static_cast<float>(std::stod(rule.substr(a + 1, b - a - 1)));
}

// Quantize-dequantize one row of H values with the rule; false when the rule is not handled here.
bool qdq_row(const std::string& rule, const QdqCase& c, const float* x, int64_t h, float* out,
             MxScaleMode mx_mode = MxScaleMode::Even) {
  if (starts_with(rule, "mx:")) {
    const std::string el = rule.substr(3);
    const MxElem e = el == "fp4" ? MxElem::Fp4E2M1 : el == "fp6_e2m3" ? MxElem::Fp6E2M3
                   : el == "fp6_e3m2" ? MxElem::Fp6E3M2 : MxElem::Fp8E4M3;
    for (int64_t k = 0; k < h; k += kMxBlock) mx_qdq_block(x + k, kMxBlock, e, mx_mode, out + k);
    return true;
  }
  if (starts_with(rule, "nvfp4(")) {
    const float gs = c.meta.at("static_scales").at("a13_gs").get<float>();
    for (int64_t k = 0; k < h; k += kNvfp4Block) nvfp4_qdq_block(x + k, kNvfp4Block, gs, out + k);
    return true;
  }
  float absmax = 0;
  for (int64_t k = 0; k < h; ++k) absmax = std::fmax(absmax, std::fabs(x[k]));
  if (starts_with(rule, "fp8_static(")) {
    const float s = arg_of(rule), inv = 1.0f / s;
    for (int64_t k = 0; k < h; ++k) out[k] = fp8_e4m3_decode(fp8_quantize_act(x[k], inv)) * s;
    return true;
  }
  if (rule == "fp8_dyn_token") {
    const float s = fp8_token_scale(absmax), inv = 1.0f / s;
    for (int64_t k = 0; k < h; ++k) out[k] = fp8_e4m3_decode(fp8_quantize_act(x[k], inv)) * s;
    return true;
  }
  if (starts_with(rule, "int8_static(")) {
    const float s = arg_of(rule);
    for (int64_t k = 0; k < h; ++k) out[k] = static_cast<float>(int8_quantize_static(x[k], s)) * s;
    return true;
  }
  if (rule == "int8_dyn_token") {
    const float s = int8_token_scale(absmax), inv = int8_token_inv_scale(absmax);
    for (int64_t k = 0; k < h; ++k) out[k] = static_cast<float>(int8_quantize_token(x[k], inv)) * s;
    return true;
  }
  return false;
}

struct Count {
  int64_t elements = 0, mismatches = 0;
  std::string first;
};

Count compare_case(const QdqCase& c, const std::string& rule, MxScaleMode mode = MxScaleMode::Even) {
  Count n;
  const int64_t t = c.x.shape.at(0), h = c.x.shape.at(1);
  std::vector<float> row(h);
  for (int64_t r = 0; r < t; ++r) {
    if (!qdq_row(rule, c, &c.x.values[r * h], h, row.data(), mode)) return n;
    for (int64_t k = 0; k < h; ++k) {
      ++n.elements;
      const float want = c.want.values[r * h + k];
      if (!(row[k] == want)) {
        if (n.mismatches++ == 0) {
          std::ostringstream m;
          m.precision(9);
          m << "row " << r << " col " << k << ": x " << c.x.values[r * h + k] << " got " << row[k] << " want " << want;
          n.first = m.str();
        }
      }
    }
  }
  return n;
}

TEST(ConformanceQdq, CasesArePresent) {
  int mx4 = 0, e2m3 = 0, e3m2 = 0, nv = 0;
  for (const auto& c : cases()) {
    ASSERT_EQ(c.x.shape.size(), 2u) << c.name;
    ASSERT_EQ(c.x.shape, c.want.shape) << c.name;
    mx4 += c.rule == "mx:fp4";
    e2m3 += c.rule == "mx:fp6_e2m3";
    e3m2 += c.rule == "mx:fp6_e3m2";
    nv += starts_with(c.rule, "nvfp4(");
  }
  EXPECT_GE(mx4, 1);
  EXPECT_GE(e2m3, 1);
  EXPECT_GE(e3m2, 1);
  EXPECT_GE(nv, 1);
}

// MX and NVFP4: pure format math, bit exact.
TEST(ConformanceQdq, MxAndNvfp4BitExact) {
  int checked = 0;
  for (const auto& c : cases()) {
    if (!starts_with(c.rule, "mx:") && !starts_with(c.rule, "nvfp4(")) continue;
    if (starts_with(c.rule, "nvfp4(")) {
      // The rule string and static_scales.a13_gs name the same quantization-direction scale.
      EXPECT_EQ(arg_of(c.rule), c.meta.at("static_scales").at("a13_gs").get<float>()) << c.name;
    }
    const Count n = compare_case(c, c.rule);
    std::cout << "[ qdq      ] " << c.name << " (" << c.rule << "): " << n.elements << " elements, " << n.mismatches
              << " mismatches\n";
    EXPECT_GT(n.elements, 0) << c.name;
    EXPECT_EQ(n.mismatches, 0) << c.name << " (" << c.rule << "): " << n.mismatches << " of " << n.elements
                               << " elements differ; first: " << n.first;
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

// FP8 / INT8 activation quantization (static and dynamic per-token): also format math.
TEST(ConformanceQdq, Fp8AndInt8BitExact) {
  int checked = 0;
  for (const auto& c : cases()) {
    if (!starts_with(c.rule, "fp8_") && !starts_with(c.rule, "int8_")) continue;
    const Count n = compare_case(c, c.rule);
    std::cout << "[ qdq      ] " << c.name << " (" << c.rule << "): " << n.elements << " elements, " << n.mismatches
              << " mismatches\n";
    EXPECT_GT(n.elements, 0) << c.name << " rule " << c.rule << " not handled";
    EXPECT_EQ(n.mismatches, 0) << c.name << " (" << c.rule << "): " << n.mismatches << " of " << n.elements
                               << " elements differ; first: " << n.first;
    ++checked;
  }
  EXPECT_GE(checked, 1);
}

// Negative control: the data discriminates between scale rules (OCP "floor" ≠ Quark "even").
TEST(ConformanceQdq, FloorRuleIsDetected) {
  int64_t mismatches = 0;
  for (const auto& c : cases())
    if (c.rule == "mx:fp4") mismatches += compare_case(c, c.rule, MxScaleMode::Floor).mismatches;
  EXPECT_GT(mismatches, 0);
}

}  // namespace
}  // namespace qmoe
