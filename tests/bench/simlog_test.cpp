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
#include "bench/uprobe_trace.h"

namespace quanta::bench {
namespace {

TEST(Handoffs, CountFromReleaseToTheLaunchOfATenantThatWasWaiting) {
  // Tenant 0 (tids 10, 11) releases at 100; tenant 1 (tid 20), waiting since 50, passes
  // its gate at 130: a 30 ns handoff... in microseconds 0.03.
  std::vector<ProbeHit> hits = {{"release", 11, 0, {100}}, {"gate_wait_end", 20, 0, {80, 130}}};
  std::map<uint32_t, int> tenants = {{10, 0}, {11, 0}, {20, 1}};
  auto handoffs = handoffs_from_hits(hits, tenants, {0, 0});
  ASSERT_EQ(handoffs.size(), 1u);
  EXPECT_DOUBLE_EQ(handoffs[0].us, 0.03);
  EXPECT_EQ(handoffs[0].released_ns, 100u);
}

TEST(Handoffs, IgnoreWaitsThatBeganAfterTheReleaseAndOtherDevices) {
  std::vector<ProbeHit> hits = {
      {"release", 10, 0, {100}},
      {"gate_wait_end", 20, 0, {1000, 6000}},  // started waiting late, at 5000
      {"gate_wait_end", 30, 0, {100, 150}},    // another device
      {"gate_wait_end", 10, 0, {100, 7100}},   // the releaser itself
  };
  std::map<uint32_t, int> tenants = {{10, 0}, {20, 1}, {30, 2}};
  EXPECT_TRUE(handoffs_from_hits(hits, tenants, {0, 0, 1}).empty());
}

TEST(Handoffs, AreTimedByTheShimsOwnStampsSoTheProbesTrapsFallOutside) {
  // The kernel recorded the release 18 us after the shim's stamp (the trap) and the wait's
  // end 18 us after its own; by the stamps the handoff took 30 us. The waiter's wait began
  // at 150 - 140 = 10, before the release at 100.
  std::vector<ProbeHit> hits = {{"release", 11, 18'100, {100'000}}, {"gate_wait_end", 20, 148'000, {140'000, 130'000}}};
  std::map<uint32_t, int> tenants = {{11, 0}, {20, 1}};
  auto handoffs = handoffs_from_hits(hits, tenants, {0, 0});
  ASSERT_EQ(handoffs.size(), 1u);
  EXPECT_DOUBLE_EQ(handoffs[0].us, 30.0);
  // A wait that began after the release (by its end less the time waited) is left out.
  hits[1].arguments = {20'000, 130'000};
  EXPECT_TRUE(handoffs_from_hits(hits, tenants, {0, 0}).empty());
}

TEST(Handoffs, FollowTheStampsOrderWhereTheKernelRecordedHitsOutOfIt) {
  // The waiter's gate end was recorded before the release's trap finished recording: by
  // the kernel's times it came first, by the stamps it follows the release.
  std::vector<ProbeHit> hits = {{"gate_wait_end", 20, 40'000, {60'000, 35'000}}, {"release", 11, 41'000, {20'000}}};
  std::map<uint32_t, int> tenants = {{11, 0}, {20, 1}};
  auto handoffs = handoffs_from_hits(hits, tenants, {0, 0});
  ASSERT_EQ(handoffs.size(), 1u);
  EXPECT_DOUBLE_EQ(handoffs[0].us, 15.0);
}

TEST(Handoffs, TheFiguresKeepOnlyThoseReleasedInsideTheSteadyWindow) {
  // Both tenants pass their gates once at start-up; then three handoffs between them,
  // released at 1 ms, 5 ms and 9 ms. The window is [2 ms, 9 ms), so the first (the tenants
  // still starting) and the last (already exiting) are left out of the figures and kept in
  // the whole run's.
  std::vector<ProbeHit> hits = {
      {"gate_wait_end", 10, 0, {100'000, 200'000}}, {"gate_wait_end", 20, 0, {400'000, 500'000}},
      {"release", 10, 0, {1'000'000}},              {"gate_wait_end", 20, 0, {400'000, 1'040'000}},
      {"release", 20, 0, {5'000'000}},              {"gate_wait_end", 10, 0, {3'500'000, 5'020'000}},
      {"release", 10, 0, {9'000'000}},              {"gate_wait_end", 20, 0, {4'500'000, 9'900'000}},
  };
  std::map<uint32_t, int> tenants = {{10, 0}, {20, 1}};
  auto handoffs = handoffs_from_hits(hits, tenants, {0, 0});
  ASSERT_EQ(handoffs.size(), 3u);
  EXPECT_EQ(steady_durations(handoffs, Window{2'000'000, 9'000'000}), std::vector<double>{20.0});
  EXPECT_EQ(steady_durations(handoffs, Window{0, 10'000'000}), (std::vector<double>{40.0, 20.0, 900.0}));
  const auto whole = whole_run_figures(handoffs);
  EXPECT_EQ(whole["handoffs"], 3);
  EXPECT_DOUBLE_EQ(whole["p50_us"].get<double>(), 40.0);
}

TEST(Handoffs, ATenantsFirstPassOfItsGateIsStartUpNotAFigure) {
  // Tenant 1 waits from the start and first passes its gate 3 ms after tenant 0's release:
  // its process runs for the first time since it started. Its next pass, 30 us after a
  // release, is a handoff between running tenants.
  std::vector<ProbeHit> hits = {
      {"release", 10, 0, {1'000'000}}, {"gate_wait_end", 20, 0, {3'900'000, 4'000'000}},
      {"release", 20, 0, {5'000'000}}, {"gate_wait_end", 10, 0, {4'500'000, 5'010'000}},
      {"release", 10, 0, {6'000'000}}, {"gate_wait_end", 20, 0, {900'000, 6'030'000}},
  };
  std::map<uint32_t, int> tenants = {{10, 0}, {20, 1}};
  auto handoffs = handoffs_from_hits(hits, tenants, {0, 0});
  ASSERT_EQ(handoffs.size(), 3u);
  EXPECT_TRUE(handoffs[0].first_pass);
  EXPECT_TRUE(handoffs[1].first_pass);  // tenant 0's first wait, too
  EXPECT_FALSE(handoffs[2].first_pass);
  EXPECT_EQ(steady_durations(handoffs, Window{0, 10'000'000}), std::vector<double>{30.0});
  EXPECT_EQ(whole_run_figures(handoffs)["handoffs"], 3);
}

TEST(TracefsFetch, TranslatesUsdtArgumentLocations) {
  EXPECT_EQ(tracefs_fetch("8@%rax"), "%ax:u64");
  EXPECT_EQ(tracefs_fetch("4@%ebx"), "%bx:u32");
  EXPECT_EQ(tracefs_fetch("-4@%r15d"), "%r15:s32");
  EXPECT_EQ(tracefs_fetch("4@32(%r10)"), "+32(%r10):u32");
  EXPECT_EQ(tracefs_fetch("8@-16(%rbp)"), "-16(%bp):u64");
  EXPECT_EQ(tracefs_fetch("2@(%rsp)"), "+0(%sp):u16");
}

TEST(TracefsFetch, RefusesWhatTracefsCannotFetchByName) {
  for (const char* location : {"8@$5", "3@%rax", "%rax", "8@%xmm0", "8@8(%rax,%rbx,2)", "8@sym(%rip)", "8@%r16",
                               "8@%r123456789012"}) {
    try {
      tracefs_fetch(location);
      ADD_FAILURE() << location << " was accepted";
    } catch (const std::runtime_error& error) {
      EXPECT_NE(std::string(error.what()).find(location), std::string::npos) << error.what();
    }
  }
}

TEST(TraceLines, ParseTheTasksThreadTheTimeTheEventAndItsArguments) {
  ProbeHit hit;
  std::string event;
  ASSERT_TRUE(parse_trace_line("  quanta-tenant-812    [001] d.... 55631.632248: release: (0x7f01a2) a1=123 a2=0x10",
                               event, hit));
  EXPECT_EQ(event, "release");
  EXPECT_EQ(hit.tid, 812u);
  EXPECT_EQ(hit.ts_ns, 55631632248000ull);
  EXPECT_EQ(hit.arguments, (std::vector<uint64_t>{123, 16}));
  // Without flags (older kernels), and a task name without its own dash.
  ASSERT_TRUE(parse_trace_line("<...>-9 [000] 12.000001: gate_wait_end: (0x1)", event, hit));
  EXPECT_EQ(hit.tid, 9u);
  EXPECT_EQ(hit.ts_ns, 12000001000ull);
  EXPECT_TRUE(hit.arguments.empty());
  for (const char* line : {"# tracer: nop", "", "quanta-tenant-812 [001] d.... 55631.632248 release: (0x1)",
                           "quanta-tenant-812 [001] d.... 55631.632248: release: (0x1) a1=12x",
                           "quanta-tenant-812 [001] d.... 55631.6322: release: (0x1)"}) {
    EXPECT_FALSE(parse_trace_line(line, event, hit)) << line;
  }
}

TEST(UsdtNotes, AFileWithoutProbesIsRefusedClearly) {
  // This test binary has no probes: reading it must say so, not crash.
  EXPECT_THROW(read_usdt_probes("/proc/self/exe"), std::runtime_error);
}

}  // namespace
}  // namespace quanta::bench
