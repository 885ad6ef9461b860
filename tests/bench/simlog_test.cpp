// The simgpu execution-log arithmetic behind the share, utilisation and switch figures.
#include "bench/scenarios.h"
#include "bench/simlog.h"

#include <gtest/gtest.h>

namespace quanta::bench {
namespace {

constexpr uint64_t kMs = 1'000'000;

TEST(SimLog, ParsesSlicesAndCountsMalformedLines) {
  SimLog log = parse_sim_log(
      "slice 0 1 100 1000 2000\n"
      "garbage line\n"
      "slice 0 2 200 2050 3000\n"
      "slice 0 2 200 5000 4000\n");  // ends before it starts
  ASSERT_EQ(log.slices.size(), 2u);
  EXPECT_EQ(log.malformed_lines, 2u);
  EXPECT_EQ(log.slices[1].pid, 200);
  EXPECT_EQ(log.slices[1].start_ns, 2050u);
}

TEST(SimLog, BusyTimeIsClippedToTheWindow) {
  SimLog log = parse_sim_log("slice 0 1 100 0 10000000\nslice 0 2 200 10000000 20000000\n");
  auto busy = busy_ns_by_pid(log, Window{5 * kMs, 15 * kMs});
  EXPECT_EQ(busy[100], 5 * kMs);
  EXPECT_EQ(busy[200], 5 * kMs);
  EXPECT_DOUBLE_EQ(utilization(log, Window{5 * kMs, 25 * kMs}), 0.75);
}

TEST(SimLog, SwitchesCountProcessChangesAndTheirIdleGaps) {
  SimLog log = parse_sim_log(
      "slice 0 1 100 0 1000000\n"
      "slice 0 1 100 1000000 2000000\n"    // same process: no switch
      "slice 0 2 200 2050000 3000000\n"    // 50 us gap
      "slice 1 3 300 0 3000000\n");        // other device: never a switch with device 0
  auto changes = switches(log, Window{0, 10 * kMs});
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].from, 100);
  EXPECT_EQ(changes[0].to, 200);
  EXPECT_EQ(changes[0].gap_ns, 50'000u);
}

TEST(Shares, ErrorIsTheWorstDistanceFromTheWeightedTargetInPoints) {
  // Equal device time for weights 1:1:2 (targets 25/25/50 %): the weight-2 tenant is
  // 50 - 33.3 = 16.7 points short.
  SimLog log = parse_sim_log("slice 0 1 1 0 1000000\nslice 0 2 2 1000000 2000000\nslice 0 3 3 2000000 3000000\n");
  std::vector<ShareTenant> tenants = {{1, 1, 0, {}}, {2, 1, 0, {}}, {3, 2, 0, {}}};
  Shares shares = measure_shares(tenants, &log, Window{0, 3 * kMs}, 1);
  ASSERT_TRUE(shares.max_share_error_pp);
  EXPECT_NEAR(*shares.max_share_error_pp, 50.0 - 100.0 / 3, 0.01);
  EXPECT_NEAR(*shares.utilization, 1.0, 1e-9);
  EXPECT_EQ(shares.tenants[2]["target_share"].get<double>(), 0.5);
}

TEST(Shares, TargetsAreComputedPerDevice) {
  SimLog log = parse_sim_log("slice 0 1 1 0 1000000\nslice 1 2 2 0 1000000\n");
  std::vector<ShareTenant> tenants = {{1, 1, 0, {}}, {2, 4, 1, {}}};
  Shares shares = measure_shares(tenants, &log, Window{0, kMs}, 2);
  EXPECT_NEAR(*shares.max_share_error_pp, 0.0, 1e-9);  // each alone on its device
  EXPECT_NEAR(*shares.utilization, 1.0, 1e-9);
}

TEST(Shares, WithoutALogTheTenantsKernelSecondsCount) {
  std::vector<ShareTenant> tenants = {{1, 1, 0, 1.0}, {2, 3, 0, 3.0}};
  Shares shares = measure_shares(tenants, nullptr, Window{}, 1);
  EXPECT_EQ(shares.source, "tenant reports");
  EXPECT_NEAR(*shares.max_share_error_pp, 0.0, 1e-9);
  EXPECT_FALSE(shares.utilization);
}

}  // namespace
}  // namespace quanta::bench

#include "bench/tracer.h"

namespace quanta::bench {
namespace {

quanta_handoff_event release(uint32_t pid, uint64_t at) {
  return {at, 0, pid, pid, 0, pid, QUANTA_PROBE_RELEASE, 0};
}
quanta_handoff_event pass(uint32_t pid, uint64_t waited, uint64_t at) {
  return {at, waited, pid, pid, 0, pid, QUANTA_PROBE_GATE_WAIT_END, 0};
}

TEST(Handoffs, CountOnlyBetweenTheRunsTenants) {
  // 99 is another process using the shim on the same machine: its release and pass are
  // no handoff of this run's.
  const std::vector<quanta_handoff_event> events = {release(10, 100), pass(99, 80, 120),
                                                    pass(20, 80, 130), release(99, 200),
                                                    pass(10, 150, 240)};
  const auto handoffs = tenant_handoffs(events, {10, 20});
  ASSERT_EQ(handoffs.size(), 1u);
  EXPECT_EQ(handoffs[0].from_pid, 10u);
  EXPECT_EQ(handoffs[0].to_pid, 20u);
  EXPECT_EQ(tenant_handoffs(events, {10, 20, 99}).size(), 2u);
}

TEST(Handoffs, TheFiguresKeepOnlyThoseReleasedInsideTheSteadyWindow) {
  // Both tenants pass their gates once at start-up; then three handoffs between them,
  // released at 1 ms, 5 ms and 9 ms. The window is [2 ms, 9 ms), so the first (the tenants
  // still starting) and the last (already exiting) are left out of the figures and kept in
  // the whole run's.
  const std::vector<quanta_handoff_event> events = {
      pass(10, 100'000, 200'000), pass(20, 400'000, 500'000),
      release(10, 1'000'000),     pass(20, 400'000, 1'040'000),
      release(20, 5'000'000),     pass(10, 3'500'000, 5'020'000),
      release(10, 9'000'000),     pass(20, 4'500'000, 9'900'000),
  };
  const auto handoffs = tenant_handoffs(events, {10, 20});
  ASSERT_EQ(handoffs.size(), 3u);
  EXPECT_EQ(steady_durations(handoffs, Window{2'000'000, 9'000'000}), std::vector<double>{20.0});
  EXPECT_EQ(steady_durations(handoffs, Window{0, 10'000'000}), (std::vector<double>{40.0, 20.0, 900.0}));
  const auto whole = whole_run_figures(handoffs);
  EXPECT_EQ(whole["handoffs"], 3);
  EXPECT_DOUBLE_EQ(whole["p50_us"].get<double>(), 40.0);
}

TEST(Handoffs, ATenantsFirstPassOfItsGateIsStartUpNotAFigure) {
  // Tenant 20 waits from the start and first passes its gate 3 ms after tenant 10's
  // release: its process runs for the first time since it started. Its next pass, 30 us
  // after a release, is a handoff between running tenants.
  const std::vector<quanta_handoff_event> events = {
      release(10, 1'000'000), pass(20, 3'900'000, 4'000'000),
      release(20, 5'000'000), pass(10, 4'500'000, 5'010'000),
      release(10, 6'000'000), pass(20, 900'000, 6'030'000),
  };
  const auto handoffs = tenant_handoffs(events, {10, 20});
  ASSERT_EQ(handoffs.size(), 3u);
  EXPECT_EQ(steady_durations(handoffs, Window{0, 10'000'000}), std::vector<double>{30.0});
  EXPECT_EQ(whole_run_figures(handoffs)["handoffs"], 3);
}

}  // namespace
}  // namespace quanta::bench
