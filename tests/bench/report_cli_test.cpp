// quanta-bench-report as scripts/bench.sh drives it: a run directory of per-scenario JSON
// (one scenario repeated as <name>.1.json, <name>.2.json, one that printed nothing) and a
// previous latest.json, through to latest.json's `changes`, the printed lines and
// RESULTS.md.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/bench/run_command.h"

namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

using quanta::bench_tests::run_command;

std::string slurp(const fs::path& file) {
  std::ifstream in(file);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

Json interactive_run(double ratio, double p99) {
  return {{"scenario", "interactive"},
          {"quick", false},
          {"date", "2026-12-01T10:00:00Z"},
          {"gpu", "sim"},
          {"elapsed_s", 10.0},
          {"machine", {{"cpu", "test"}, {"cores", 2}, {"kernel", "k"}, {"gpu", "simgpu"}}},
          {"quanta", {{"p99_ms", p99}}},
          {"targets",
           {{"p99_vs_native",
             {{"description", "quanta p99_ms <= 0.45 x native p99_ms"},
              {"value", ratio},
              {"limit", 0.45},
              {"comparison", "<="},
              {"met", ratio <= 0.45},
              {"margin", ratio - 0.45}}}}}};
}

class ReportCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("quanta-report-cli-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "run");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const fs::path& file, const Json& doc) { std::ofstream(file) << doc.dump(2); }
  fs::path dir_;
};

TEST_F(ReportCli, RepeatedRunsAreFoldedAndComparedWithThePreviousLatest) {
  write(dir_ / "run" / "interactive.1.json", interactive_run(0.42, 3.0));
  write(dir_ / "run" / "interactive.2.json", interactive_run(0.99, 7.0));
  write(dir_ / "run" / "interactive.3.json", interactive_run(0.52, 4.0));
  std::ofstream(dir_ / "run" / "churn.json") << "";
  std::ofstream(dir_ / "run" / "churn.err") << "quanta-bench: churn: simgpu did not start\n";
  Json previous = {{"date", "2026-11-30T00:00:00Z"},
                   {"command", "scripts/bench.sh build"},
                   {"gpu", "sim"},
                   {"interactive", interactive_run(0.40, 2.5)}};
  write(dir_ / "previous.json", previous);

  int status = -1;
  std::string printed =
      run_command(std::string(QUANTA_BENCH_REPORT_BINARY) + " --inputs " + (dir_ / "run").string() +
              " --scenarios 'interactive churn' --json " + (dir_ / "latest.json").string() +
              " --markdown " + (dir_ / "RESULTS.md").string() + " --previous " +
              (dir_ / "previous.json").string() + " --print-changes --command 'bench.sh test'",
          status);
  ASSERT_EQ(status, 0) << printed;

  Json latest = Json::parse(slurp(dir_ / "latest.json"));
  const Json& target = latest["interactive"]["targets"]["p99_vs_native"];
  EXPECT_DOUBLE_EQ(target["value"].get<double>(), 0.52);
  EXPECT_DOUBLE_EQ(target["worst"].get<double>(), 0.99);
  EXPECT_FALSE(target["met"].get<bool>());
  EXPECT_EQ(latest["interactive"]["repeat"]["runs"].size(), 3u);
  EXPECT_DOUBLE_EQ(latest["interactive"]["quanta"]["p99_ms"].get<double>(), 4.0);
  EXPECT_NE(latest["churn"]["note"].get<std::string>().find("simgpu did not start"),
            std::string::npos);

  EXPECT_NE(printed.find(
                "target p99_vs_native: 0.4 -> 0.52, +0.12 (+30%), away from the target (<= 0.45), "
                "met -> missed, worse beyond noise"),
            std::string::npos)
      << printed;
  EXPECT_NE(printed.find("quanta.p99_ms: 2.5 -> 4, +1.5 (+60%)"), std::string::npos) << printed;
  EXPECT_NE(printed.find("churn: new"), std::string::npos) << printed;

  std::string md = slurp(dir_ / "RESULTS.md");
  EXPECT_NE(md.find("**1 target worsened beyond noise**"), std::string::npos) << md;
  EXPECT_NE(md.find("## churn"), std::string::npos) << md;
  EXPECT_NE(md.find("worst run 0.99"), std::string::npos) << md;

  // --render-only keeps the comparison the run stored.
  ASSERT_EQ(run_command(std::string(QUANTA_BENCH_REPORT_BINARY) + " --from " +
                    (dir_ / "latest.json").string() + " --markdown " + (dir_ / "again.md").string(),
                status),
            "");
  EXPECT_EQ(status, 0);
  EXPECT_NE(slurp(dir_ / "again.md").find("## Changes since the previous run"), std::string::npos);
}

TEST_F(ReportCli, AMissingOrBrokenPreviousMeansEveryFigureIsNew) {
  write(dir_ / "run" / "interactive.json", interactive_run(0.42, 3.0));
  std::ofstream(dir_ / "broken.json") << "{not json";
  for (const std::string previous : {"absent.json", "broken.json"}) {
    int status = -1;
    std::string printed =
        run_command(std::string(QUANTA_BENCH_REPORT_BINARY) + " --inputs " + (dir_ / "run").string() +
                " --json " + (dir_ / "latest.json").string() + " --markdown " +
                (dir_ / "RESULTS.md").string() + " --previous " + (dir_ / previous).string() +
                " --print-changes",
            status);
    ASSERT_EQ(status, 0) << printed;
    EXPECT_NE(printed.find("every figure is new"), std::string::npos) << printed;
    EXPECT_NE(printed.find("target p99_vs_native: — -> 0.42, new"), std::string::npos) << printed;
    EXPECT_NE(slurp(dir_ / "RESULTS.md").find("- changes: none to show"), std::string::npos);
  }
}

}  // namespace
