// `qmoe inspect` and `qmoe dequant`, run as the built binary (QMOE_CLI_PATH) on the conformance
// cases: dequant output must equal io.safetensors dequant.<e>.* (requant.<e>.w13 with
// --after-load) bit for bit; inspect --json must report the case's scheme and sizes; errors must
// exit non-zero with a message on stderr and leave no output file.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "qmoe/safetensors.h"

namespace qmoe {
namespace {

namespace fs = std::filesystem;

const fs::path kCases = fs::path(QMOE_SOURCE_DIR "/../shared/conformance/cases");

bool small_mode() {
  const char* s = std::getenv("QMOE_TEST_SMALL");
  return s != nullptr && std::string(s) == "1";
}

nlohmann::json read_json_file(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

std::vector<std::string> cases_with_error(bool errors) {
  std::vector<std::string> out;
  for (const auto& d : fs::directory_iterator(kCases)) {
    if (!d.is_directory() || !fs::exists(d.path() / "case.json")) continue;
    if (read_json_file(d.path() / "case.json").value("expect_error", false) == errors)
      out.push_back(d.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct CliResult {
  int code = -1;
  std::string out, err;
};

class CliInspectDequant : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("qmoe_cli_inspect_dequant_" + std::to_string(rd()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  CliResult run(const std::string& args) {
    const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    const std::string cmd = std::string("'") + QMOE_CLI_PATH + "' " + args + " > '" + out.string() + "' 2> '" +
                            err.string() + "'";
    const int st = std::system(cmd.c_str());
    CliResult r;
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  static std::string q(const fs::path& p) {
    std::string s(1, '\'');
    s.append(p.string()).push_back('\'');
    return s;
  }

  // Exact comparison by value (−0 == +0).
  static ::testing::AssertionResult same(const std::vector<float>& got, const std::vector<float>& want,
                                         const std::string& what) {
    if (got.size() != want.size())
      return ::testing::AssertionFailure() << what << ": " << got.size() << " values, expected " << want.size();
    for (size_t i = 0; i < got.size(); ++i)
      if (!(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))))
        return ::testing::AssertionFailure() << what << ": first mismatch at " << i << ": got " << got[i]
                                             << ", expected " << want[i];
    return ::testing::AssertionSuccess();
  }

  fs::path dir_;
};

TEST_F(CliInspectDequant, DequantEqualsConformanceBitForBit) {
  int checked = 0;
  for (const std::string& name : cases_with_error(false)) {
    SCOPED_TRACE(name);
    const fs::path cd = kCases / name;
    const auto meta = read_json_file(cd / "case.json");
    const auto io = SafetensorsFile::open((cd / "io.safetensors").string());
    std::vector<int> experts = meta.at("dequant_experts").get<std::vector<int>>();
    if (small_mode()) experts.resize(1);
    for (int e : experts) {
      const std::string k = "dequant." + std::to_string(e), rq = "requant." + std::to_string(e) + ".w13";
      const bool has_requant = io->find(rq) != nullptr;
      for (int after = 0; after < (has_requant ? 2 : 1); ++after) {
        const fs::path out = dir_ / "dq.safetensors";
        const CliResult r = run("dequant " + q(cd) + " --layer 0 --expert " + std::to_string(e) + " -o " + q(out) +
                                (after ? " --after-load" : ""));
        ASSERT_EQ(r.code, 0) << r.err;
        const auto f = SafetensorsFile::open(out.string());
        EXPECT_EQ(f->get("w13").dtype(), DType::F32);
        EXPECT_TRUE(same(to_f32(f->get("w13")), to_f32(io->get(after ? rq : k + ".w13")), k + ".w13"));
        EXPECT_TRUE(same(to_f32(f->get("w2")), to_f32(io->get(k + ".w2")), k + ".w2"));
        EXPECT_EQ(f->get("w13").shape(), io->get(k + ".w13").shape());
        ++checked;
        fs::remove(out);
      }
    }
  }
  EXPECT_GT(checked, 0);
  std::printf("[ cli ] qmoe dequant: %d expert outputs bit-exact\n", checked);
}

TEST_F(CliInspectDequant, DequantTensorParallelRankHoldsItsSlice) {
  for (const std::string& name : cases_with_error(false)) {
    const fs::path cd = kCases / name;
    const auto meta = read_json_file(cd / "case.json");
    if (!meta.value("parallel", false)) continue;
    SCOPED_TRACE(name);
    const auto io = SafetensorsFile::open((cd / "io.safetensors").string());
    const int e = meta.at("dequant_experts").back().get<int>();
    const int64_t H = meta.at("H").get<int64_t>(), I = meta.at("I").get<int64_t>();
    const bool interleaved = meta.value("activation_params", nlohmann::json::object()).value("layout", "") == "interleaved";
    const fs::path out = dir_ / "tp.safetensors";
    const CliResult r = run("dequant " + q(cd) + " --layer 0 --expert " + std::to_string(e) + " --tp-rank 1 --tp-size 2 -o " + q(out));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto f = SafetensorsFile::open(out.string());
    const std::vector<float> w13 = to_f32(f->get("w13")), w2 = to_f32(f->get("w2"));
    const int64_t Ip = f->get("w2").shape()[1], start = I - Ip;  // rank 1 holds the tail
    const std::vector<float> full13 = to_f32(io->get("dequant." + std::to_string(e) + ".w13"));
    const std::vector<float> full2 = to_f32(io->get("dequant." + std::to_string(e) + ".w2"));
    std::vector<float> want13, want2;
    if (interleaved) {
      want13.assign(full13.begin() + 2 * start * H, full13.end());
    } else {
      for (int half = 0; half < 2; ++half)
        want13.insert(want13.end(), full13.begin() + (half * I + start) * H, full13.begin() + (half * I + I) * H);
    }
    for (int64_t h = 0; h < H; ++h) want2.insert(want2.end(), full2.begin() + h * I + start, full2.begin() + (h + 1) * I);
    EXPECT_TRUE(same(w13, want13, "w13 tp rank 1"));
    EXPECT_TRUE(same(w2, want2, "w2 tp rank 1"));
  }
}

TEST_F(CliInspectDequant, DequantErrorsExitNonZeroAndWriteNothing) {
  const fs::path ok = kCases / "qwen3_w_mxfp4";
  const fs::path out = dir_ / "never.safetensors";
  struct Bad {
    std::string args;
    std::string keyword;
  };
  const std::vector<Bad> bad = {
      {"dequant " + q(ok) + " --layer 0 --expert 99 -o " + q(out), "out of range"},
      {"dequant " + q(ok) + " --layer 0 --expert 1 --tp-rank 0 --tp-size 3 -o " + q(out), "not divisible"},
      {"dequant " + q(ok) + " --layer 0 --expert 1 --tp-rank 2 --tp-size 2 -o " + q(out), "tp_rank"},
      {"dequant " + q(ok) + " --layer 0 -o " + q(out), "--expert"},
      {"dequant " + q(ok) + " --layer 0 --shared -o " + q(out), "no shared expert"},
      {"dequant " + q(ok) + " --layer 3 --expert 0 -o " + q(out), "layer"},
      {"dequant " + q(kCases / "err_missing_expert_tensor") + " --layer 0 --expert 5 -o " + q(out),
       "experts.5.up_proj.weight"},
      {"dequant " + q(kCases / "err_weight_scale_shape") + " --layer 0 --expert 2 -o " + q(out), "shape"},
      {"dequant " + q(ok) + " --layer 0 --expert 1 -o " + q(dir_ / "no_such_dir" / "x.safetensors"), ""},
      {"dequant " + q(ok) + " --layer 0 --expert 1", "output"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.args);
    const CliResult r = run(b.args);
    EXPECT_NE(r.code, 0);
    EXPECT_FALSE(r.err.empty());
    EXPECT_NE(lower(r.err).find(lower(b.keyword)), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out));
    EXPECT_FALSE(fs::exists(fs::path(out.string() + ".tmp")));
  }
  // Only the requested expert is read: expert 4 of the case missing expert 5's tensor is fine.
  const CliResult r = run("dequant " + q(kCases / "err_missing_expert_tensor") + " --layer 0 --expert 4 -o " + q(out));
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(CliInspectDequant, InspectJsonReportsSchemeSizesAndParameters) {
  for (const std::string& name : cases_with_error(false)) {
    SCOPED_TRACE(name);
    const fs::path cd = kCases / name;
    const auto meta = read_json_file(cd / "case.json");
    const CliResult r = run("inspect " + q(cd) + " --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["architecture"]["hidden_size"], meta["H"]);
    EXPECT_EQ(j["architecture"]["num_experts"], meta["E"]);
    EXPECT_EQ(j["architecture"]["top_k"], meta["K"]);
    ASSERT_EQ(j["layers"].size(), 1u);
    const auto& l = j["layers"][0];
    EXPECT_EQ(l["scheme"], meta["scheme"]);
    EXPECT_EQ(l["num_experts"], meta["E"]);
    EXPECT_EQ(l["intermediate"], meta["I"]);
    EXPECT_FALSE(l["matched_by"].get<std::string>().empty());
    int64_t sum = 0;
    std::vector<std::string> names;
    for (const auto& p : l["params"]) {
      sum += p["bytes"].get<int64_t>();
      names.push_back(p["name"].get<std::string>());
    }
    EXPECT_EQ(sum, l["total_bytes"].get<int64_t>());
    EXPECT_NE(std::find(names.begin(), names.end(), "w13_weight"), names.end());
    EXPECT_NE(std::find(names.begin(), names.end(), "w2_weight"), names.end());
    // Zero points are dropped by processing.
    EXPECT_EQ(std::find(names.begin(), names.end(), "w13_weight_zero_point"), names.end());
    if (meta["arch"] == "gpt_oss") {
      EXPECT_NE(std::find(names.begin(), names.end(), "w2_bias"), names.end());
    }
    if (meta["arch"] == "deepseek_v3") {
      EXPECT_TRUE(l.contains("shared_expert"));
    }
    if (meta["scheme"] == "unquantized") {
      EXPECT_TRUE(l["excluded"].get<bool>());
    }
    if (meta.value("static_scales", nlohmann::json::object()).value("input_scales_differ_per_expert", false)) {
      EXPECT_FALSE(j["warnings"].empty());
    }
    if (small_mode()) break;
  }
}

TEST_F(CliInspectDequant, InspectTextShowsTheParameterTable) {
  const CliResult r = run("inspect " + q(kCases / "mixtral_int8_wtensor_astatic"));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* s : {"w_int8_tensor_a_int8_static", "QuarkW8A8Int8MoEMethod", "model.layers.0.block_sparse_moe.experts",
                        "w13_weight", "[8, 256, 256]", "bits/weight", "differs across experts"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST_F(CliInspectDequant, InspectErrorCasesFailWithKeywords) {
  for (const std::string& name : cases_with_error(true)) {
    SCOPED_TRACE(name);
    const auto meta = read_json_file(kCases / name / "case.json");
    const CliResult r = run("inspect " + q(kCases / name));
    EXPECT_NE(r.code, 0);
    bool found = false;
    for (const auto& k : meta["error_keywords"]) found = found || lower(r.err).find(lower(k.get<std::string>())) != std::string::npos;
    EXPECT_TRUE(found) << r.err;
  }
  const CliResult r = run("inspect " + q(dir_ / "does_not_exist"));
  EXPECT_NE(r.code, 0);
  EXPECT_FALSE(r.err.empty());
}

}  // namespace
}  // namespace qmoe
