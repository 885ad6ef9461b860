// What a restarted arbiter takes back of what its tenants still map, stated without a daemon:
// only the regions its state file recorded, only the process entries of processes it
// admitted that are alive and map that very region (the entries are tenant-writable), and
// each slot to the process whose owner word it carries.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <memory>

#include "arbiter/state/region_recovery.h"

namespace quanta::arbiter {
namespace {

UniqueFd some_fd() {
  return UniqueFd(memfd_create("quanta-recovery-test", MFD_CLOEXEC));
}

TEST(Recovery, OnlyARegionTheStateFileRecordedByInodeAndNameIsTakenBack) {
  RecoveryScan scan;
  scan.regions[41] = FoundRegion{"q.pod.3", 41, 100, some_fd()};
  scan.regions[42] = FoundRegion{"q.pod.4", 42, 100, UniqueFd()};  // could not be reopened
  scan.regions[43] = FoundRegion{"q.pod.5", 43, 101, some_fd()};

  FoundRegion* found = recorded_region(scan, 41, "q.pod.3");
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->pid, 100);
  EXPECT_EQ(recorded_region(scan, 0, "q.pod.3"), nullptr) << "the state file recorded no inode";
  EXPECT_EQ(recorded_region(scan, 44, "q.pod.3"), nullptr) << "no tenant maps it any more";
  EXPECT_EQ(recorded_region(scan, 43, "q.pod.3"), nullptr)
      << "another region under a recorded inode: a tenant's own memfd is never looked at";
  EXPECT_EQ(recorded_region(scan, 42, "q.pod.4"), nullptr) << "found but not reopened";
}

TEST(Recovery, AnEntryIsAdoptedOnlyForARecordedLiveProcessThatMapsTheRegion) {
  EntryFacts genuine;
  genuine.recorded = true;
  genuine.alive = true;
  genuine.maps_region = true;
  EXPECT_EQ(entry_fate(genuine), EntryFate::kAdopt);

  EntryFacts forged = genuine;  // a tenant wrote another pid into its entry
  forged.recorded = false;
  EXPECT_EQ(entry_fate(forged), EntryFate::kReclaim);

  EntryFacts exited = genuine;
  exited.alive = false;
  EXPECT_EQ(entry_fate(exited), EntryFate::kReclaim);

  EntryFacts reused = genuine;  // the pid lives, but as a process that does not map the pod
  reused.maps_region = false;
  EXPECT_EQ(entry_fate(reused), EntryFate::kReclaim);

  EntryFacts twice = genuine;  // the same pid in a second pod's entries
  twice.adopted_already = true;
  EXPECT_EQ(entry_fate(twice), EntryFate::kReclaim);
}

TEST(Recovery, ARecordedProcessWhoseMapsWereNotReadInTimeKeepsItsMemoryCounted) {
  EntryFacts slow;
  slow.recorded = true;
  slow.unanswered = true;
  EXPECT_EQ(entry_fate(slow), EntryFate::kKeepCounted);
  slow.alive = true;
  slow.maps_region = true;
  EXPECT_EQ(entry_fate(slow), EntryFate::kKeepCounted);

  EntryFacts stranger;  // unanswered but never recorded in this pod: nothing to keep
  stranger.unanswered = true;
  EXPECT_EQ(entry_fate(stranger), EntryFate::kReclaim);
}

TEST(Recovery, EachSlotGoesToTheProcessWhoseOwnerWordItCarries) {
  auto region = std::make_unique<common::ControlRegion>();
  region->slots[0].owner.store(0xa1);
  region->slots[3].owner.store(0xb2);
  region->slots[7].owner.store(0xa1);  // a word two slots carry names the first
  const auto by_owner = slots_by_owner(*region);
  const std::map<uint32_t, uint32_t> expected = {{0xa1, 0}, {0xb2, 3}};
  EXPECT_EQ(by_owner, expected) << "slots without an owner word are nobody's";
}

}  // namespace
}  // namespace quanta::arbiter
