// `qmoe bench --device cpu`: sized from the machine (LLC from sysfs, weight copies over ≥ 4 × LLC
// unless --max-weight-gb caps them, which it says), JSON fields, and the > 100 % flag field.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cpu/membw.h"

namespace qmoe {
namespace {

namespace fs = std::filesystem;

struct Out {
  int rc = -1;
  std::string out, err;
};

Out run_bench(const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / ("qmoe_cli_bench_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string cmd = std::string("\"") + QMOE_CLI_PATH + "\" bench " + args + " >" + (dir / "o.txt").string() +
                          " 2>" + (dir / "e.txt").string();
  const int status = std::system(cmd.c_str());
  Out r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto slurp = [](const fs::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  r.out = slurp(dir / "o.txt");
  r.err = slurp(dir / "e.txt");
  fs::remove_all(dir);
  return r;
}

TEST(CliBench, LastLevelCacheFromSysfs) {
  const cpu::CacheInfo c = cpu::last_level_cache();
  EXPECT_GT(c.llc_bytes, 0);
  if (fs::exists("/sys/devices/system/cpu/cpu0/cache/index0/level")) {
    EXPECT_TRUE(c.from_sysfs);
    EXPECT_GE(c.level, 2);
    EXPECT_GE(c.instances, 1);
  }
}

TEST(CliBench, JsonCarriesLlcWorkingSetAndFlag) {
  // 0.02 GB caps the weight copies of the tiny shape below 4 × LLC on any machine with ≥ 5 MB LLC:
  // the command must say so.
  const Out r = run_bench("--device cpu --shape tiny --scheme w_mxfp4_a_mxfp4 --tokens 1,3 --reps 1 --threads 1 "
                          "--max-weight-gb 0.02 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  const cpu::CacheInfo c = cpu::last_level_cache();
  for (const auto& p : j) {
    EXPECT_EQ(p.at("llc_bytes").get<int64_t>(), c.llc_bytes);
    EXPECT_GE(p.at("weight_copies").get<int>(), 1);
    EXPECT_GT(p.at("working_set_bytes").get<double>(), 0.0);
    EXPECT_LE(p.at("working_set_bytes").get<double>(), 0.02e9 + 1.0);
    EXPECT_EQ(p.at("above_bandwidth").get<bool>(), p.at("pct_of_bandwidth").get<double>() > 100.0);
    EXPECT_GT(p.at("bandwidth_gbps").get<double>(), 0.0);
  }
  if (c.llc_bytes >= (int64_t{5} << 20)) {
    EXPECT_NE(r.err.find("working set below 4 × LLC"), std::string::npos) << r.err;
  }
  EXPECT_NE(r.err.find("LLC"), std::string::npos);
}

TEST(CliBench, CudaDeviceWithoutCudaIsAClearError) {
#ifdef QMOE_HAVE_CUDA
  GTEST_SKIP() << "built with CUDA";
#else
  const Out r = run_bench("--device cuda --shape qwen3-30b-a3b --scheme w_mxfp4_a_mxfp4 --tokens 1,16");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("qmoe: error: --device cuda: CUDA is not built in"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
#endif
}

TEST(CliBench, OptionErrorsBeforeAnyWork) {
  Out r = run_bench("--device cpu --shape tiny --scheme w_mxfp4+xbf16 --tokens 1");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("on the CPU only +bf16act applies"), std::string::npos) << r.err;
  r = run_bench("--device gpu --shape tiny --tokens 1");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("expected cpu or cuda"), std::string::npos) << r.err;
  r = run_bench("--device cpu --shape tiny --tokens 1,zero");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--tokens: 'zero'"), std::string::npos) << r.err;
  r = run_bench("--device cpu --shape tiny --tokens 1 --ep 2");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("add --device cuda"), std::string::npos) << r.err;
  r = run_bench("--device cuda --shape tiny --tokens 1 --tp 0");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("at least 1"), std::string::npos) << r.err;
}

TEST(CliBench, CsvPlotAndLaterOptionsWin) {
  const fs::path dir = fs::temp_directory_path() / ("qmoe_cli_bench_files_" + std::to_string(getpid()));
  fs::create_directories(dir);
  // --tokens given twice: the later one wins (scripts append overrides); --shapes is an alias.
  const Out r = run_bench("--device cpu --shapes tiny --scheme w_mxfp4 --tokens 1,2,4 --tokens 2 --reps 1 --threads 1 "
                          "--csv " + (dir / "b.csv").string() + " --plot " + (dir / "b.svg").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("| tiny | w_mxfp4 |"), std::string::npos) << r.out;
  std::ifstream f(dir / "b.csv");
  std::string header, row, extra;
  std::getline(f, header);
  std::getline(f, row);
  EXPECT_EQ(header.rfind("shape,scheme,T,U,us,GBps,TFLOPps,floor_us,bound,pct_floor,", 0), 0u) << header;
  EXPECT_EQ(row.rfind("tiny,w_mxfp4,2,", 0), 0u) << row;
  EXPECT_FALSE(std::getline(f, extra) && !extra.empty()) << extra;
  EXPECT_TRUE(fs::exists(dir / "b.svg"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qmoe
