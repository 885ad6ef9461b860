// Admission and attach as the arbiter decides them, stated without a daemon: which pod a
// process joins (its container's, or the one it names when the node admits unregistered
// processes), what a refused process does under each [enforce] unplaced rule, the layouts a
// pod takes, the GPUs a container may attach to and the slot it gets.
#include "arbiter/admission.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/support/temp_dir.h"

namespace quanta::arbiter {
namespace {

using common::RefusedAction;

constexpr uint32_t kLayout3 = common::kLayoutVersion;
constexpr uint32_t kLayout2 = common::layout2::kVersion;

// A registry with one registered container: pod prod/web (cgroup /kubepods/pod-web/c1),
// capped at 1 GiB.
class Admission : public ::testing::Test {
 protected:
  Admission() {
    config_.scope = "admission-test";
    config_.state_dir = scratch_.path();
    pods_.probe_cgroups_with([](const std::string&) { return true; });
    const Registration web{"c1",     "uid-web",
                           "web",    "prod",
                           "server", "/kubepods/pod-web/c1",
                           {},       {{"memory-limit", "1Gi"}}};
    EXPECT_EQ(pods_.register_container(web), "");
  }
  PodChoice choose(pid_t pid, const std::string& cgroup, const std::string& claimed,
                   uint32_t layout = kLayout3) const {
    return choose_pod({pid, cgroup, claimed, layout}, pods_, config_, previous_release_pods_);
  }
  test_support::TempDir scratch_{"quanta-admission"};
  config::NodeConfig config_;
  PodRegistry pods_{config_};
  std::set<std::string> previous_release_pods_;
};

TEST_F(Admission, AProcessInARegisteredContainerJoinsItsPodWhateverItClaims) {
  for (const std::string cgroup : {"/kubepods/pod-web/c1", "/kubepods/pod-web/c1/sub/leaf"}) {
    const PodChoice choice = choose(100, cgroup, "someone/else");
    ASSERT_FALSE(choice.refusal) << choice.refusal->reason;
    EXPECT_EQ(choice.key, "prod/web") << cgroup;
    ASSERT_NE(choice.registration, nullptr);
    EXPECT_EQ(choice.registration->container_id, "c1");
    // Capped and registered: refused later, it is denied under closed-if-capped.
    EXPECT_EQ(choice.action, RefusedAction::kDeny);
  }
  // A sibling whose path only begins the same is not inside the container.
  EXPECT_EQ(choose(100, "/kubepods/pod-web/c10", "").registration, nullptr);
}

TEST_F(Admission, AnUnregisteredProcessIsRefusedUnlessTheNodeAdmitsThemNamingTheSetting) {
  const PodChoice choice = choose(4242, "/user.slice/x", "dev/job");
  ASSERT_TRUE(choice.refusal);
  EXPECT_NE(choice.refusal->reason.find("pid 4242 (cgroup /user.slice/x)"), std::string::npos)
      << choice.refusal->reason;
  EXPECT_NE(choice.refusal->reason.find("allow_unregistered = false"), std::string::npos);
  EXPECT_EQ(choice.refusal->action, RefusedAction::kRunOpen);  // uncapped: runs open

  const PodChoice unknown = choose(4242, "", "dev/job");
  ASSERT_TRUE(unknown.refusal);
  EXPECT_NE(unknown.refusal->reason.find("(cgroup unknown)"), std::string::npos);
}

TEST_F(Admission, ACgroupPathIsQuotedPrintableInTheRefusal) {
  const PodChoice choice = choose(7, "/evil\n\x1b[2Jpath", "");
  ASSERT_TRUE(choice.refusal);
  EXPECT_EQ(choice.refusal->reason.find('\n'), std::string::npos) << choice.refusal->reason;
  EXPECT_EQ(choice.refusal->reason.find('\x1b'), std::string::npos) << choice.refusal->reason;
}

TEST_F(Admission, AnUnregisteredProcessJoinsTheValidUnregisteredPodItNames) {
  config_.allow_unregistered = true;
  const PodChoice joined = choose(5, "/user.slice/x", "dev-job");
  ASSERT_FALSE(joined.refusal) << joined.refusal->reason;
  EXPECT_EQ(joined.key, "dev-job");
  EXPECT_EQ(joined.registration, nullptr);
  EXPECT_EQ(joined.action, RefusedAction::kRunOpen);

  const PodChoice nameless = choose(5, "/user.slice/x", "");
  ASSERT_TRUE(nameless.refusal);
  EXPECT_NE(nameless.refusal->reason.find("set QUANTA_POD=<name>"), std::string::npos);

  const PodChoice bad = choose(5, "/user.slice/x", "bad name\n");
  ASSERT_TRUE(bad.refusal);
  EXPECT_NE(bad.refusal->reason.find("QUANTA_POD"), std::string::npos) << bad.refusal->reason;

  // A registered pod's name is its containers' alone.
  const PodChoice stolen = choose(5, "/user.slice/x", "prod/web");
  ASSERT_TRUE(stolen.refusal);
  EXPECT_EQ(stolen.refusal->reason,
            "QUANTA_POD prod/web names a registered pod; only its own containers join it");
}

TEST_F(Admission, EachUnplacedRuleGivesTheRefusedProcessItsAction) {
  common::Policy capped;
  capped.memory_limit = 1ull << 30;
  common::Policy uncapped;
  using config::UnplacedAction;
  EXPECT_EQ(unplaced_action(UnplacedAction::kOpen, true, &capped), RefusedAction::kRunOpen);
  EXPECT_EQ(unplaced_action(UnplacedAction::kClosed, false, nullptr), RefusedAction::kDeny);
  EXPECT_EQ(unplaced_action(UnplacedAction::kClosedIfCapped, true, &capped), RefusedAction::kDeny);
  EXPECT_EQ(unplaced_action(UnplacedAction::kClosedIfCapped, true, &uncapped),
            RefusedAction::kRunOpen);
  EXPECT_EQ(unplaced_action(UnplacedAction::kClosedIfCapped, false, &capped),
            RefusedAction::kRunOpen);
  EXPECT_EQ(unplaced_action(UnplacedAction::kClosedIfCapped, true, nullptr),
            RefusedAction::kRunOpen);

  config_.enforce.unplaced = UnplacedAction::kClosed;
  const PodChoice refused = choose(9, "/elsewhere", "");
  ASSERT_TRUE(refused.refusal);
  EXPECT_EQ(refused.refusal->action, RefusedAction::kDeny);
}

TEST_F(Admission, LayoutTwoIsOnlyForPodsThePreviousReleasePlacedOrThatHaveARegion) {
  const PodChoice fresh = choose(11, "/kubepods/pod-web/c1", "", kLayout2);
  ASSERT_TRUE(fresh.refusal);
  EXPECT_NE(fresh.refusal->reason.find("pod prod/web was not placed by the previous release"),
            std::string::npos)
      << fresh.refusal->reason;
  EXPECT_EQ(fresh.refusal->action, RefusedAction::kDeny);

  previous_release_pods_.insert("prod/web");
  EXPECT_FALSE(choose(11, "/kubepods/pod-web/c1", "", kLayout2).refusal);

  previous_release_pods_.clear();
  pods_.get_or_create("prod/web", true, "", kLayout2);
  EXPECT_FALSE(choose(11, "/kubepods/pod-web/c1", "", kLayout2).refusal);
  // Layout 3 is every pod's.
  EXPECT_FALSE(choose(11, "/kubepods/pod-web/c1", "", kLayout3).refusal);
}

TEST(AdmissionRules, APodTakesProcessesOfItsOwnLayoutWhileAnEntryIsFree) {
  std::bitset<common::kMaxProcsPerPod> entries;
  EXPECT_EQ(free_entry(entries), 0u);
  EXPECT_FALSE(join_refusal("prod/web", kLayout3, entries, kLayout3));
  entries.set(0);
  entries.set(1);
  entries.set(3);
  EXPECT_EQ(free_entry(entries), 2u);

  const auto mixed = join_refusal("prod/web", kLayout3, entries, kLayout2);
  ASSERT_TRUE(mixed);
  EXPECT_NE(mixed->find("pod prod/web's other processes map shared-memory layout 3, this "
                        "process's libquanta.so 2"),
            std::string::npos)
      << *mixed;

  entries.set();
  EXPECT_EQ(free_entry(entries), common::kMaxProcsPerPod);
  const auto full = join_refusal("prod/web", kLayout3, entries, kLayout3);
  ASSERT_TRUE(full);
  EXPECT_EQ(*full, "pod prod/web already has 64 processes on the GPUs, the most one pod may have");
}

TEST(AdmissionRules, AnAdmittedProcessKeepsItsLayout) {
  EXPECT_FALSE(hello_refusal(12, kLayout3, kLayout3));
  const auto changed = hello_refusal(12, kLayout3, kLayout2);
  ASSERT_TRUE(changed);
  EXPECT_NE(
      changed->find("pid 12 was admitted with shared-memory layout 3 and now says Hello with 2"),
      std::string::npos)
      << *changed;
}

TEST(AttachRules, AContainerAttachesOnlyToTheGpusItWasGivenAndIsToldWhichThoseAre) {
  DeviceGrant all;
  all.all = true;
  EXPECT_FALSE(device_refusal(all, "GPU-a"));

  DeviceGrant some;
  some.uuids = {"GPU-a", "MIG-b"};
  some.source = "its registration";
  EXPECT_FALSE(device_refusal(some, "MIG-b"));
  const auto other = device_refusal(some, "GPU-c");
  ASSERT_TRUE(other);
  EXPECT_EQ(*other,
            "GPU GPU-c was not given to this container (its registration gives GPU-a, MIG-b)");

  DeviceGrant none;
  none.source = "the devices cgroup";
  EXPECT_EQ(*device_refusal(none, "GPU-a"),
            "GPU GPU-a was not given to this container (the devices cgroup gives none)");
}

TEST(AttachRules, ANewTenantGetsTheLowestFreeSlotAndNoneOnAFullGpu) {
  std::map<SlotId, pid_t> slots;
  EXPECT_EQ(first_free_slot(slots), 0u);
  slots = {{0, 10}, {1, 11}, {3, 13}};
  EXPECT_EQ(first_free_slot(slots), 2u);
  slots[2] = 12;
  EXPECT_EQ(first_free_slot(slots), 4u);
  slots.clear();
  for (SlotId s = 0; s < common::kMaxSlotsPerGpu; ++s) slots[s] = static_cast<pid_t>(100 + s);
  EXPECT_EQ(first_free_slot(slots), common::kNoSlot);
  slots.erase(common::kMaxSlotsPerGpu - 1);
  EXPECT_EQ(first_free_slot(slots), common::kMaxSlotsPerGpu - 1);
}

}  // namespace
}  // namespace quanta::arbiter
