// The hostile-tenant suite: quanta-hostile (hostile_tenant.cpp) attacks everything a tenant
// can reach while well-behaved pods run under libquanta.so on simgpu. The verdicts come
// from what the code under test does not write itself: simgpu's execution log (shares),
// the tenants' own reports (grants and denials, exit codes) and the pod ledgers watched
// from outside. Every other pod's share, cap and ledger must stay exact, and the arbiter
// must keep serving.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "tests/integration/harness.h"

namespace quanta::integration {
namespace {

constexpr uint64_t kMi = 1ull << 20;

// The highest value one pod's ledger word on GPU 0 reached, watched from outside.
class LedgerWatch {
 public:
  LedgerWatch(const World& world, const std::string& pod)
      : thread_([this, &world, pod] {
          int index = -1;
          while (!stop_ && (index = find_pod_region(world, pod)) < 0) sleep_ms(1);
          if (index < 0) return;
          PodView view(world, static_cast<uint32_t>(index));
          found_ = view.ok();
          while (!stop_ && view.ok()) {
            max_ = std::max<uint64_t>(max_, view->memory_used[0].load());
            sleep_ms(0.2);
          }
        }) {}
  ~LedgerWatch() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  uint64_t max() const { return max_; }
  bool found() const { return found_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<bool> found_{false};
  std::atomic<uint64_t> max_{0};
  std::thread thread_;
};

nlohmann::json clean_report(Child& tenant, double timeout_s, const std::string& what) {
  const int code = tenant.wait(timeout_s);
  EXPECT_EQ(code, 0) << what << " (pid " << tenant.pid() << ") stderr:\n" << tenant.err();
  nlohmann::json report = tenant.json();
  EXPECT_TRUE(report.is_object() && report.value("ok", false)) << what << ": " << tenant.out();
  return report;
}

TEST(Hostile, AHostileTenantLeavesEveryOtherPodsShareCapAndLedgerExact) {
  World world(
      test_name(),
      ArbiterConfig{
          .quantum = "20ms",
          .lease = "400ms",
          .pods = {{"light", 1, ""}, {"heavy", 2, ""}, {"capped", 1, "256Mi"}, {"evil", 1, "64Mi"}},
          .nvml_interval = "200ms",
          // Reported, not killed (the node's default), so that the attacker runs every attack
          // to its end; the kill is EnforceTest's to prove.
          .extra = "[enforce]\nover_cap = \"report\"\n"});
  world.start_arbiter();
  ASSERT_TRUE(eventually(5, [&] { return ControlView(world, 0).ok(); }));
  const std::string uuid = ControlView(world, 0)->header.uuid;
  const Env overhead = {{"QUANTA_CONTEXT_OVERHEAD", "16Mi"}};
  LedgerWatch light_ledger(world, "light");
  LedgerWatch capped_ledger(world, "capped");

  const double seconds = 4.0;
  const std::string at = start_in(800);
  const uint64_t started = monotonic_ns() + 800 * kMs;
  auto batch = [&](double s) {
    return std::vector<std::string>{"batch",       "--seconds",  std::to_string(s),
                                    "--kernel-ms", "2",          "--depth",
                                    "2",           "--start-at", at};
  };
  Child light = world.spawn_tenant(batch(seconds), "light", true, overhead);
  Child heavy = world.spawn_tenant(batch(seconds), "heavy", true, overhead);
  Child capped = world.spawn_tenant(
      {"alloc", "--race", "--bytes", "16Mi", "--hold-ms", "3000", "--start-at", at}, "capped", true,
      overhead);
  // The attacker: pod evil, claiming pod heavy's name too, with the GPU's UUID to attach.
  Child hostile =
      world.spawn({QUANTA_HOSTILE_BINARY, std::to_string(seconds + 0.5), "20261201", "heavy", uuid},
                  world.tenant_env("evil", false));

  bool evil_reported = false;
  const uint64_t until = monotonic_ns() + static_cast<uint64_t>((seconds + 0.5) * 1e9);
  while (monotonic_ns() < until) {
    const nlohmann::json s = world.admin({{"cmd", "status"}});
    ASSERT_TRUE(s.value("ok", false)) << "the arbiter stopped serving: " << s.dump() << "\n"
                                      << world.arbiter_log();
    for (const auto& o : s["gpus"][0].value("over_cap", nlohmann::json::array()))
      evil_reported |= o["pod"] == "evil";
    sleep_ms(100);
  }

  const nlohmann::json light_report = clean_report(light, 30, "light");
  const nlohmann::json heavy_report = clean_report(heavy, 30, "heavy");
  const nlohmann::json capped_report = clean_report(capped, 30, "capped");
  ASSERT_EQ(hostile.wait(30), 0) << hostile.err();
  const nlohmann::json attack = hostile.json();
  ASSERT_TRUE(attack.is_object()) << hostile.out() << hostile.err();
  ASSERT_TRUE(world.arbiter().running()) << world.arbiter_log();
  light_ledger.stop();
  capped_ledger.stop();

  // What the attacker tried, and that none of it worked.
  EXPECT_TRUE(attack.value("welcomed", false)) << attack.dump();
  EXPECT_EQ(attack.value("control_writable", -1), 0) << attack.dump();
  EXPECT_EQ(attack.value("resized", -1), 0) << attack.dump();
  EXPECT_EQ(attack.value("sealed", -1), 0) << attack.dump();
  EXPECT_EQ(attack.value("welcomed_as_other", -1), 0) << attack.dump();
  EXPECT_GT(attack.value("messages", 0), 100) << attack.dump();
  EXPECT_GT(attack.value("doorbells", 0), 10000) << attack.dump();
  EXPECT_GT(attack.value("bypass_bytes", 0ull), 64 * kMi) << attack.dump();
  EXPECT_TRUE(evil_reported)
      << "the attacker's pod, over its cap by NVML's count, was not reported";

  // Shares: heavy (weight 2) against light (weight 1) by the device's own log.
  const auto busy = busy_by_pid(read_sim_log(world.sim_log_path()), started + 300 * kMs,
                                started + static_cast<uint64_t>((seconds - 0.3) * 1e9));
  const double l = static_cast<double>(busy.count(light.pid()) ? busy.at(light.pid()) : 0);
  const double h = static_cast<double>(busy.count(heavy.pid()) ? busy.at(heavy.pid()) : 0);
  ASSERT_GT(l + h, 0.0);
  const double heavy_share = h / (l + h);
  ::testing::Test::RecordProperty("heavy_share_of_victims", std::to_string(heavy_share));
  EXPECT_NEAR(heavy_share, 2.0 / 3.0, 0.08) << "weights 2:1 under attack gave " << heavy_share;
  EXPECT_GT(light_report.value("kernels", 0), 100) << light_report.dump();
  EXPECT_GT(heavy_report.value("kernels", 0), 100) << heavy_report.dump();

  // Cap and ledgers, to the byte: 16 MiB of context plus 15 allocations of 16 MiB fill 256 MiB.
  EXPECT_EQ(capped_report.value("successes", 0), 15) << capped_report.dump();
  EXPECT_EQ(capped_report.value("oom", 0), 1) << capped_report.dump();
  ASSERT_TRUE(capped_ledger.found());
  EXPECT_EQ(capped_ledger.max(), 256 * kMi) << "the capped pod's ledger is not what it allocated";
  ASSERT_TRUE(light_ledger.found());
  EXPECT_EQ(light_ledger.max(), 16 * kMi) << "the light pod's ledger is not its one context";
  const nlohmann::json after = world.admin({{"cmd", "status"}});
  EXPECT_TRUE(after.value("ok", false));
}

TEST(Hostile, TenantsAreStillAdmittedAndGatedWhileAHostileTenantFloodsTheArbiter) {
  World world(test_name(), ArbiterConfig{.quantum = "20ms", .pods = {{"a", 1, ""}, {"b", 1, ""}}});
  world.start_arbiter();
  ASSERT_TRUE(eventually(5, [&] { return ControlView(world, 0).ok(); }));
  const std::string uuid = ControlView(world, 0)->header.uuid;
  std::vector<Child> attackers;
  for (int i = 0; i < 3; ++i) {
    attackers.push_back(world.spawn({QUANTA_HOSTILE_BINARY, "3", std::to_string(i), "a", uuid},
                                    world.tenant_env("flood" + std::to_string(i), false)));
  }
  sleep_ms(500);
  const uint64_t asked = monotonic_ns();
  const std::string at = start_in(200);
  Child a = world.spawn_tenant({"batch", "--seconds", "1.5", "--kernel-ms", "2", "--start-at", at},
                               "a", true);
  Child b = world.spawn_tenant({"batch", "--seconds", "1.5", "--kernel-ms", "2", "--start-at", at},
                               "b", true);
  ControlView view(world, 0);
  ASSERT_TRUE(eventually(3, [&] {
    return view.slot_of(a.pid()) != common::kNoSlot && view.slot_of(b.pid()) != common::kNoSlot;
  })) << "tenants were not admitted while the arbiter was flooded";
  ::testing::Test::RecordProperty("admission_under_flood_us",
                                  std::to_string((monotonic_ns() - asked) / 1000));
  clean_report(a, 30, "a");
  clean_report(b, 30, "b");
  for (Child& attacker : attackers) EXPECT_EQ(attacker.wait(30), 0) << attacker.err();
  // Gated: one tenant at a time, each hold about a quantum (ungated simgpu alternates every 1 ms).
  const auto slices = read_sim_log(world.sim_log_path());
  std::vector<Slice> mine;
  for (const Slice& s : slices) {
    if (s.pid == a.pid() || s.pid == b.pid()) mine.push_back(s);
  }
  const auto holds = holds_of(mine);
  size_t long_holds = 0;
  for (const Hold& hold : holds) long_holds += hold.end_ns - hold.start_ns >= 10 * kMs;
  EXPECT_GE(long_holds * 2, holds.size()) << "gating did not hold under the flood";
  EXPECT_TRUE(world.arbiter().running()) << world.arbiter_log();
}

}  // namespace
}  // namespace quanta::integration
