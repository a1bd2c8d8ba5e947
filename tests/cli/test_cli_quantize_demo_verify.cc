// The CLI's quantize / demo / verify commands, run as a user runs them.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "qmoe/safetensors.h"
#include "qmoe/schemes.h"

namespace {

namespace fs = std::filesystem;
const std::string kCli = QMOE_CLI_PATH;
const std::string kCases = QMOE_SOURCE_DIR "/../shared/conformance/cases";

struct CliRun {
  int code = -1;
  std::string output;  // stdout + stderr
};

CliRun run_cli(const std::string& args) {
  CliRun r;
  const std::string cmd = kCli + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "qmoe-cli-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& s) const { return (path / s).string(); }
};

TEST(CliVerify, AllConformanceCasesPass) {
  const CliRun r = run_cli("verify " + kCases + " --kernel both");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(" 0 failed"), std::string::npos) << r.output;
  // Every case directory appears in the table.
  for (const auto& e : fs::directory_iterator(kCases)) {
    if (fs::exists(e.path() / "case.json")) {
      EXPECT_NE(r.output.find(e.path().filename().string()), std::string::npos) << e.path();
    }
  }
}

TEST(CliVerify, FailingCaseExitsNonZero) {
  // A copy of a case whose expected output is perturbed by 5 %: must FAIL with a non-zero exit.
  TempDir d;
  fs::create_directories(d / "bad");
  for (const char* f : {"case.json", "config.json", "model.safetensors"})
    fs::copy_file(kCases + "/qwen3_w_mxfp4/" + f, d / ("bad/" + std::string(f)));
  const auto io = qmoe::SafetensorsFile::open(kCases + "/qwen3_w_mxfp4/io.safetensors");
  std::vector<qmoe::NamedTensor> tensors;
  for (const auto& t : io->tensors()) {
    qmoe::Tensor v = io->get(t.name);
    if (t.name == "expected") {
      v = v.clone();
      for (int64_t i = 0; i < v.numel(); ++i) v.mutable_data_as<float>()[i] *= 1.05f;
    }
    tensors.push_back({t.name, v});
  }
  qmoe::write_safetensors(d / "bad/io.safetensors", tensors);
  const CliRun r = run_cli("verify " + (d / "bad") + " --kernel reference");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("FAIL"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("0 passed, 1 failed"), std::string::npos) << r.output;
  // A directory that is not a case is an error.
  EXPECT_NE(run_cli("verify " + (d / "nosuch")).code, 0);
}

// `qmoe quantize source --scheme <case scheme>` reproduces the case's quantized weight tensors.
TEST(CliQuantize, ReproducesConformanceWeights) {
  TempDir d;
  for (const std::string c : {"edge_topk_all_qwen3_nvfp4", "gpt_oss_w_mxfp4_bias", "qwen3_w_mxfp4_a_mxfp4",
                              "qwen3_w_mxfp6_e3m2_a_mxfp6_e3m2"}) {
    const auto cj = nlohmann::json::parse(std::ifstream(kCases + "/" + c + "/case.json"));
    const std::string scheme = cj["scheme"];
    std::string cmd = "quantize " + kCases + "/" + c + "/source --scheme " + scheme + " -o " + (d / c);
    if (qmoe::act_is_static(qmoe::scheme_by_name(scheme).act)) cmd += " --calib " + kCases + "/" + c + "/io.safetensors";
    const CliRun r = run_cli(cmd + " --threads 2");
    ASSERT_EQ(r.code, 0) << cmd << "\n" << r.output;
    const auto ours = qmoe::SafetensorsFile::open(d / (c + "/model.safetensors"));
    const auto ref = qmoe::SafetensorsFile::open(kCases + "/" + c + "/model.safetensors");
    int n = 0;
    for (const auto& t : ref->tensors()) {
      if (!(t.name.ends_with(".weight") || t.name.ends_with(".weight_scale") || t.name.ends_with(".weight_scale_2")))
        continue;
      ASSERT_NE(ours->find(t.name), nullptr) << c << " " << t.name;
      const qmoe::Tensor a = ours->get(t.name), b = ref->get(t.name);
      ASSERT_EQ(a.nbytes(), b.nbytes()) << t.name;
      EXPECT_EQ(a.dtype(), b.dtype()) << t.name;
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << c << " " << t.name;
      ++n;
    }
    EXPECT_GT(n, 0) << c;
  }
}

TEST(CliQuantize, StaticSchemeWithoutCalibFails) {
  TempDir d;
  const CliRun r = run_cli("quantize " + kCases + "/edge_topk_all_qwen3_nvfp4/source --scheme nvfp4 -o " + (d / "x"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--calib"), std::string::npos) << r.output;
  const CliRun u = run_cli("quantize " + kCases + "/edge_topk_all_qwen3_nvfp4/source --scheme nosuch -o " + (d / "x"));
  EXPECT_NE(u.code, 0);
  EXPECT_NE(u.output.find("unknown scheme"), std::string::npos) << u.output;
}

TEST(CliDemo, TinyShapeListsEverySchemeWithSensibleErrors) {
  TempDir d;
  const CliRun r = run_cli("demo --shape tiny --tokens 8 --repeats 1 --threads 2 --device cpu --out " + (d / "demo"));
  ASSERT_EQ(r.code, 0) << r.output;
  for (const auto& s : qmoe::all_schemes()) EXPECT_NE(r.output.find(std::string(s.name)), std::string::npos) << s.name;
  EXPECT_NE(r.output.find("relL2"), std::string::npos);
  ASSERT_TRUE(fs::exists(d / "demo/demo.csv"));
  const auto j = nlohmann::json::parse(std::ifstream(d / "demo/demo.json"));
  std::map<std::string, double> rel;
  for (const auto& row : j["rows"]) {
    EXPECT_TRUE(row["ok"].get<bool>()) << row.dump();
    rel[row["scheme"]] = row["devices"]["cpu"]["rel_l2"].get<double>();
  }
  EXPECT_EQ(rel.size(), qmoe::all_schemes().size());
  // Error model (same family, more bits → smaller error); bf16 reproduces the fp32 layer closely.
  EXPECT_LT(rel["unquantized"], 1e-2);
  EXPECT_LT(rel["w_mxfp6_e2m3"], rel["w_mxfp4"]);
  EXPECT_LT(rel["w_mxfp6_e3m2"], rel["w_mxfp4"]);
  EXPECT_LT(rel["w_mxfp4"], rel["w_mxfp4_a_mxfp4"]);  // quantizing activations adds error
  EXPECT_LT(rel["w_int8_channel_a_int8_dyn_token"], rel["w_mxfp4"]);
  EXPECT_LT(rel["w_fp8_channel_a_fp8_dyn_token"], rel["w_mxfp4"]);
  EXPECT_LT(rel["w_int8_channel_a_int8_dyn_token"], rel["w_mxfp4_a_mxfp4"]);
  EXPECT_LT(rel["w_fp8_tensor_a_fp8_static"], rel["nvfp4"]);
  for (const auto& [s, v] : rel)
    if (s != "unquantized") {
      EXPECT_GT(v, 1e-4) << s;
      EXPECT_LT(v, 0.6) << s;
    }
}

}  // namespace
