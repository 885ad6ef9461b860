// The comparison `make bench` prints against the previous latest.json, and the folding of
// repeated runs into medians: built from small hand-written runs whose every change is
// known, so a wrong sign, a wrong direction or a mishandled missing figure fails here.
#include "bench/report_compare.h"

#include <gtest/gtest.h>

#include <sstream>

namespace quanta::bench {
namespace {

Json target(double value, double limit, const char* comparison) {
  bool met = std::string(comparison) == "<=" ? value <= limit : value >= limit;
  return {{"description", "a target"}, {"value", value}, {"limit", limit},
          {"comparison", comparison},  {"met", met},     {"margin", value - limit}};
}

// Two runs of `interactive` and `overhead`: p99 ratio improves (towards its <= target),
// throughput ratio falls (away from its >= target) and misses, a figure goes unmeasured,
// one appears, and `churn` is new.
Json previous_run() {
  return Json{
      {"date", "2026-11-30T00:00:00Z"},
      {"command", "scripts/bench.sh build"},
      {"gpu", "sim"},
      {"interactive",
       {{"scenario", "interactive"},
        {"quick", false},
        {"elapsed_s", 20.0},
        {"quanta",
         {{"p99_ms", 4.0}, {"p50_ms", 2.0}, {"source", "simgpu execution log"}, {"missed", 0}}},
        {"native", {{"p99_ms", 8.0}, {"batch_throughput", nullptr}, {"note", "why"}}},
        {"p99_over_native", 0.5},
        {"workload", {{"seconds", 6}}},
        {"targets", {{"p99_vs_native", target(0.5, 0.5, "<=")}}}}},
      {"overhead",
       {{"scenario", "overhead"},
        {"ratio", 1.0},
        {"tenants", Json::array({{{"share", 0.5}}})},
        {"targets", {{"throughput", target(1.0, 0.95, ">=")}}}}},
      {"memcap", {{"scenario", "memcap"}, {"quanta", {{"denials", 3}}}}}};
}

Json current_run() {
  return Json{
      {"date", "2026-12-01T00:00:00Z"},
      {"gpu", "sim"},
      {"interactive",
       {{"scenario", "interactive"},
        {"quick", false},
        {"elapsed_s", 21.0},
        {"quanta",
         {{"p99_ms", 3.0}, {"p50_ms", nullptr}, {"source", "tenant reports"}, {"missed", 0}}},
        {"native", {{"p99_ms", 8.0}, {"batch_throughput", 0.9}, {"requests", 300}}},
        {"p99_over_native", 0.375},
        {"workload", {{"seconds", 7}}},
        {"targets", {{"p99_vs_native", target(0.375, 0.5, "<=")}}}}},
      {"overhead",
       {{"scenario", "overhead"},
        {"ratio", 0.8},
        {"tenants", Json::array({{{"share", 0.9}}})},
        {"targets", {{"throughput", target(0.8, 0.95, ">=")}}}}},
      {"churn", {{"scenario", "churn"}, {"quanta", {{"max_wait_ms", 12.5}}}}}};
}

const std::vector<std::string> kOrder = {"fairness", "interactive", "overhead", "memcap", "churn"};

const Json& row(const Json& comparison, const std::string& scenario, const std::string& figure) {
  for (const auto& entry : comparison["figures"]) {
    if (entry["scenario"] == scenario && entry["figure"] == figure) return entry;
  }
  static const Json kMissing = {{"status", "(no such row)"}};
  ADD_FAILURE() << "no row for " << scenario << " " << figure;
  return kMissing;
}

std::string status_of(const Json& comparison, const std::string& scenario) {
  for (const auto& entry : comparison["scenarios"]) {
    if (entry["scenario"] == scenario) return entry["status"].get<std::string>();
  }
  return "(absent)";
}

TEST(BenchCompare, TargetThatFellUnderItsCeilingMovedTowardsIt) {
  Json changes = compare_runs(previous_run(), current_run(), kOrder, 10);
  const Json& p99 = row(changes, "interactive", "targets.p99_vs_native");
  EXPECT_EQ(p99["before"], 0.5);
  EXPECT_EQ(p99["now"], 0.375);
  EXPECT_DOUBLE_EQ(p99["change"].get<double>(), -0.125);
  EXPECT_DOUBLE_EQ(p99["change_pct"].get<double>(), -25.0);
  EXPECT_EQ(p99["direction"], "towards");
  EXPECT_EQ(p99["comparison"], "<=");
  EXPECT_EQ(p99["verdict_before"], "met");
  EXPECT_EQ(p99["verdict_now"], "met");
  EXPECT_FALSE(p99["worse"].get<bool>());
}

// A target whose baseline alone varies by more than its limit (launch-cost's 8 threads on
// simgpu) carries no verdict: neither met nor missed, and so never "newly missed".
TEST(BenchCompare, AnInconclusiveTargetIsNeitherMetNorMissed) {
  Json before = previous_run();
  Json now = current_run();
  Json inconclusive = target(-46.2, 25.0, "<=");
  inconclusive["met"] = nullptr;
  inconclusive["inconclusive"] = "the direct runs alone spread over 866 ns, more than the limit";
  before["launch-cost"] = {{"scenario", "launch-cost"}, {"targets", {{"added_launch_ns_8_threads", target(40.0, 25.0, "<=")}}}};
  now["launch-cost"] = {{"scenario", "launch-cost"}, {"targets", {{"added_launch_ns_8_threads", inconclusive}}}};
  std::vector<std::string> order = kOrder;
  order.push_back("launch-cost");
  Json changes = compare_runs(before, now, order, 10);
  const Json& threaded = row(changes, "launch-cost", "targets.added_launch_ns_8_threads");
  EXPECT_EQ(threaded["verdict_before"], "missed");
  EXPECT_EQ(threaded["verdict_now"], "inconclusive");
}

TEST(BenchCompare, TargetThatFellBelowItsFloorMovedAwayAndIsCalledWorse) {
  Json changes = compare_runs(previous_run(), current_run(), kOrder, 10);
  const Json& throughput = row(changes, "overhead", "targets.throughput");
  EXPECT_DOUBLE_EQ(throughput["change"].get<double>(), -0.2);
  EXPECT_DOUBLE_EQ(throughput["change_pct"].get<double>(), -20.0);
  EXPECT_EQ(throughput["direction"], "away");
  EXPECT_EQ(throughput["verdict_before"], "met");
  EXPECT_EQ(throughput["verdict_now"], "missed");
  EXPECT_TRUE(throughput["beyond_noise"].get<bool>());
  EXPECT_TRUE(throughput["worse"].get<bool>());
}

TEST(BenchCompare, MovingAwayWithinNoiseIsNotWorse) {
  Json previous = previous_run(), current = current_run();
  current["overhead"]["targets"]["throughput"] = target(0.97, 0.95, ">=");  // -3%, still met
  Json changes = compare_runs(previous, current, kOrder, 10);
  const Json& throughput = row(changes, "overhead", "targets.throughput");
  EXPECT_EQ(throughput["direction"], "away");
  EXPECT_FALSE(throughput["beyond_noise"].get<bool>());
  EXPECT_FALSE(throughput["worse"].get<bool>());
  // A tighter noise band makes the same move count.
  EXPECT_TRUE(
      row(compare_runs(previous, current, kOrder, 2), "overhead", "targets.throughput")["worse"]
          .get<bool>());
}

TEST(BenchCompare, FiguresWithoutATargetCarryTheirChangeButNoDirection) {
  Json changes = compare_runs(previous_run(), current_run(), kOrder, 10);
  const Json& p99 = row(changes, "interactive", "quanta.p99_ms");
  EXPECT_DOUBLE_EQ(p99["change"].get<double>(), -1.0);
  EXPECT_DOUBLE_EQ(p99["change_pct"].get<double>(), -25.0);
  EXPECT_EQ(p99["status"], "changed");
  EXPECT_FALSE(p99.contains("direction"));
  EXPECT_EQ(row(changes, "interactive", "native.p99_ms")["status"], "unchanged");
  EXPECT_EQ(row(changes, "interactive", "quanta.missed")["status"], "unchanged");
}

TEST(BenchCompare, NullsAndAbsentFiguresSayWhatWasNotMeasured) {
  Json changes = compare_runs(previous_run(), current_run(), kOrder, 10);
  EXPECT_EQ(row(changes, "interactive", "quanta.p50_ms")["status"], "not measured now");
  EXPECT_EQ(row(changes, "interactive", "native.batch_throughput")["status"],
            "not measured before");
  EXPECT_EQ(row(changes, "interactive", "native.requests")["status"], "new");
  EXPECT_TRUE(row(changes, "interactive", "native.requests")["change"].is_null());
}

TEST(BenchCompare, RunMetadataStringsAndArraysAreNotFigures) {
  Json changes = compare_runs(previous_run(), current_run(), kOrder, 10);
  for (const auto& entry : changes["figures"]) {
    std::string figure = entry["figure"].get<std::string>();
    EXPECT_EQ(figure.find("elapsed_s"), std::string::npos) << figure;
    EXPECT_EQ(figure.find("workload"), std::string::npos) << figure;
    EXPECT_EQ(figure.find("source"), std::string::npos) << figure;
    EXPECT_EQ(figure.find("tenants"), std::string::npos) << figure;
    EXPECT_EQ(figure.find("quick"), std::string::npos) << figure;
  }
}

TEST(BenchCompare, ScenariosOnOneSideOnlyAreNewOrNotRun) {
  Json changes = compare_runs(previous_run(), current_run(), kOrder, 10);
  EXPECT_EQ(status_of(changes, "interactive"), "compared");
  EXPECT_EQ(status_of(changes, "churn"), "new");
  EXPECT_EQ(status_of(changes, "memcap"), "not run now");
  EXPECT_EQ(status_of(changes, "fairness"), "(absent)");  // in neither run
  EXPECT_EQ(row(changes, "churn", "quanta.max_wait_ms")["status"], "new");
  // Order follows the report's order, not the alphabet.
  ASSERT_EQ(changes["scenarios"].size(), 4u);
  EXPECT_EQ(changes["scenarios"][0]["scenario"], "interactive");
  EXPECT_EQ(changes["scenarios"][3]["scenario"], "churn");
}

TEST(BenchCompare, NoPreviousRunMakesEveryFigureNew) {
  Json changes = compare_runs(Json(nullptr), current_run(), kOrder, 10);
  EXPECT_TRUE(changes["previous"].is_null());
  EXPECT_NE(changes["previous_note"].get<std::string>().find("new"), std::string::npos);
  EXPECT_EQ(status_of(changes, "interactive"), "new");
  for (const auto& entry : changes["figures"]) EXPECT_EQ(entry["status"], "new") << entry.dump();
}

TEST(BenchCompare, AnOlderLayoutIsReadForWhatItHas) {
  // An older latest.json: a scenario as a bare number, targets without comparison or met.
  Json previous = {
      {"interactive", 3},
      {"overhead", {{"ratio", "fast"}, {"targets", {{"throughput", {{"value", 0.9}}}}}}}};
  Json changes = compare_runs(previous, current_run(), kOrder, 10);
  EXPECT_EQ(status_of(changes, "interactive"), "new");
  EXPECT_EQ(row(changes, "overhead", "ratio")["status"],
            "not measured before");  // a string is no figure
  const Json& throughput = row(changes, "overhead", "targets.throughput");
  EXPECT_EQ(throughput["direction"], "away");  // now's comparison (>=) decides
  EXPECT_EQ(throughput["verdict_before"], "not measured");
  EXPECT_TRUE(throughput["worse"].get<bool>());  // -11% against 10% noise
}

TEST(BenchCompare, QuickAgainstFullIsFlaggedAsNotLikeForLike) {
  Json current = current_run();
  current["interactive"]["quick"] = true;
  Json changes = compare_runs(previous_run(), current, kOrder, 10);
  EXPECT_NE(changes.value("previous_note", "").find("--quick"), std::string::npos);
}

TEST(BenchCompare, PrintedAndMarkdownFormsNameTheChanges) {
  Json changes = compare_runs(previous_run(), current_run(), kOrder, 10);
  std::ostringstream text, md;
  print_comparison(text, changes);
  comparison_markdown(md, changes);
  EXPECT_NE(
      text.str().find(
          "target p99_vs_native: 0.5 -> 0.375, -0.125 (-25%), towards the target (<= 0.5), met"),
      std::string::npos)
      << text.str();
  EXPECT_NE(text.str().find("target throughput: 1 -> 0.8, -0.2 (-20%), away from the target (>= "
                            "0.95), met -> missed"),
            std::string::npos)
      << text.str();
  EXPECT_NE(text.str().find("memcap: not run this time"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("churn: new"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("Worsened beyond noise (10%): overhead target throughput;"),
            std::string::npos)
      << text.str();
  EXPECT_NE(md.str().find("**Worsened beyond noise:**"), std::string::npos) << md.str();
  EXPECT_NE(md.str().find("| quanta.p50_ms | 2 | — | not measured now |  |"), std::string::npos)
      << md.str();
}

TEST(BenchRepeat, FiguresAreMediansAndTargetsKeepTheirWorstRun) {
  auto run = [](double p99, double ratio, const Json& p50) {
    return Json{{"scenario", "interactive"},
                {"machine", {{"cores", 2}}},
                {"elapsed_s", 10.0},
                {"quanta", {{"p99_ms", p99}, {"p50_ms", p50}, {"source", "log"}}},
                {"targets", {{"p99_vs_native", target(ratio, 0.45, "<=")}}}};
  };
  Json merged = merge_repeats({run(3.0, 0.42, 1.0), run(9.0, 0.99, nullptr), run(4.0, 0.52, 2.0)});
  EXPECT_DOUBLE_EQ(merged["quanta"]["p99_ms"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(merged["quanta"]["p50_ms"].get<double>(),
                   1.5);  // median of the two that measured
  const Json& t = merged["targets"]["p99_vs_native"];
  EXPECT_DOUBLE_EQ(t["value"].get<double>(), 0.52);
  EXPECT_DOUBLE_EQ(t["worst"].get<double>(), 0.99);
  EXPECT_FALSE(t["met"].get<bool>());
  EXPECT_NEAR(t["margin"].get<double>(), 0.07, 1e-9);
  EXPECT_EQ(t["runs"], Json::array({0.42, 0.99, 0.52}));
  EXPECT_NE(t["description"].get<std::string>().find("median of 3 runs"), std::string::npos);
  EXPECT_EQ(merged["repeat"]["count"], 3);
  ASSERT_EQ(merged["repeat"]["runs"].size(), 3u);
  EXPECT_DOUBLE_EQ(merged["repeat"]["runs"][1]["quanta"]["p99_ms"].get<double>(), 9.0);
  EXPECT_FALSE(merged["repeat"]["runs"][0].contains("machine"));
  EXPECT_TRUE(merged.contains("machine"));
  EXPECT_DOUBLE_EQ(merged["elapsed_s"].get<double>(), 30.0);
}

TEST(BenchRepeat, AtLeastTargetsTakeTheLowestRunAsWorst) {
  auto run = [](double ratio) {
    return Json{{"targets", {{"throughput", target(ratio, 0.95, ">=")}}}};
  };
  Json merged = merge_repeats({run(0.99), run(0.90), run(0.97)});
  EXPECT_DOUBLE_EQ(merged["targets"]["throughput"]["value"].get<double>(), 0.97);
  EXPECT_DOUBLE_EQ(merged["targets"]["throughput"]["worst"].get<double>(), 0.90);
  EXPECT_TRUE(merged["targets"]["throughput"]["met"].get<bool>());
}

TEST(BenchRepeat, ASingleRunComesBackUnchanged) {
  Json one = current_run()["interactive"];
  EXPECT_EQ(merge_repeats({one}), one);
}

}  // namespace
}  // namespace quanta::bench
