// Admission bounds across an arbiter restart: the pods a restarted arbiter re-adopts keep
// running, and they count against the bounds on new claims exactly as they did before, so
// killing the arbiter never lets one cgroup claim more unregistered pods than it could.
#include <gtest/gtest.h>
#include <signal.h>

#include <set>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace quanta::integration {
namespace {

constexpr int kPerCgroup = 8;  // PodRegistry::kMaxClaimedPodsPerCgroup

bool all_attached(const World& world, std::vector<Child>& tenants) {
  const std::set<pid_t> attached = world.connected_pids();
  for (Child& tenant : tenants)
    if (!tenant.running() || attached.count(tenant.pid()) == 0) return false;
  return true;
}

// A process claiming pod `pod` (every process here shares the test's cgroup): holds 16 MiB
// for a minute unless killed first.
Child claim(World& world, const std::string& pod) {
  return world.spawn_tenant({"alloc", "--count", "1", "--bytes", "16Mi", "--hold-ms", "60000"}, pod,
                            true, {{"QUANTA_CONTEXT_OVERHEAD", "16Mi"}});
}

// Waits until the shim of `tenant` says the arbiter refused it, or it shows up attached.
bool refused(World& world, Child& tenant) {
  eventually(15, [&] {
    return tenant.err().find("refused") != std::string::npos ||
           world.connected_pids().count(tenant.pid()) != 0;
  });
  return tenant.err().find("refused") != std::string::npos &&
         world.connected_pids().count(tenant.pid()) == 0;
}

TEST(Faults, ARestartKeepsReadoptedClaimedPodsAndCountsThemAgainstTheirCgroupsBound) {
  World world("ARestartKeepsReadoptedClaimedPods");
  world.start_arbiter();
  std::vector<Child> holders;
  for (int i = 0; i < kPerCgroup; ++i) holders.push_back(claim(world, "claim" + std::to_string(i)));
  ASSERT_TRUE(eventually(20, [&] { return all_attached(world, holders); }))
      << "the first " << kPerCgroup << " claimed pods were not all admitted; arbiter log:\n"
      << world.arbiter_log();

  Child before = claim(world, "claim-before");
  EXPECT_TRUE(refused(world, before))
      << "a " << kPerCgroup + 1 << "th pod claimed from one cgroup was not refused; stderr:\n"
      << before.err();
  EXPECT_LT(find_pod_region(world, "claim-before"), 0);
  before.signal(SIGKILL);
  before.wait(10);

  world.kill_arbiter(SIGKILL);
  world.start_arbiter();
  // Running pods survive the restart: every holder is re-adopted and attaches again.
  EXPECT_TRUE(eventually(20, [&] { return all_attached(world, holders); }))
      << "a re-adopted pod's process did not attach again after the restart; arbiter log:\n"
      << world.arbiter_log();
  for (int i = 0; i < kPerCgroup; ++i)
    EXPECT_GE(find_pod_region(world, "claim" + std::to_string(i)), 0) << "pod claim" << i;

  // ... and they still fill the cgroup's bound.
  Child after = claim(world, "claim-after");
  EXPECT_TRUE(refused(world, after))
      << "after the restart one cgroup got a " << kPerCgroup + 1
      << "th unregistered pod: the re-adopted pods were not counted; stderr:\n"
      << after.err() << "\narbiter log:\n"
      << world.arbiter_log();
  EXPECT_LT(find_pod_region(world, "claim-after"), 0);
  after.signal(SIGKILL);
  after.wait(10);

  // The bound is a count, not a ban: once a pod leaves, the cgroup may claim another.
  holders[0].signal(SIGKILL);
  holders[0].wait(10);
  ASSERT_TRUE(eventually(10, [&] { return find_pod_region(world, "claim0") < 0; }))
      << "pod claim0 kept its region after its only process died";
  std::vector<Child> replacement;
  replacement.push_back(claim(world, "claim-replacement"));
  EXPECT_TRUE(eventually(15, [&] { return all_attached(world, replacement); }))
      << "a pod claimed after another left was not admitted; stderr:\n"
      << replacement[0].err() << "\narbiter log:\n"
      << world.arbiter_log();

  for (Child& holder : holders) holder.signal(SIGKILL);
  replacement[0].signal(SIGKILL);
  for (Child& holder : holders) holder.wait(10);
  replacement[0].wait(10);
}

}  // namespace
}  // namespace quanta::integration
