// Unit tests of the shim's own data structures, run in-process (and under ASan in the
// sanitizer build): the pod ledger's compare-and-swap, the allocation table, options.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "shim/allocation_table.h"
#include "shim/options.h"
#include "shim/pod_ledger.h"

namespace quanta::shim {
namespace {

struct Words {
  std::atomic<uint64_t> pod_used{0};
  std::atomic<uint64_t> process_used{0};
  std::atomic<uint64_t> cap{0};
  MemoryAccount account() { return MemoryAccount{&pod_used, &process_used, &cap}; }
};

TEST(PodLedger, ReservesUpToTheCapExactly) {
  Words w;
  w.cap = 100;
  EXPECT_TRUE(PodLedger::try_reserve(w.account(), 60));
  EXPECT_FALSE(PodLedger::try_reserve(w.account(), 41));
  EXPECT_TRUE(PodLedger::try_reserve(w.account(), 40));
  EXPECT_EQ(w.pod_used, 100u);
  EXPECT_EQ(w.process_used, 100u);
  EXPECT_FALSE(PodLedger::try_reserve(w.account(), 1));
  EXPECT_EQ(PodLedger::room(w.account()), 0u);
}

TEST(PodLedger, NoCapCountsWithoutLimit) {
  Words w;
  EXPECT_TRUE(PodLedger::try_reserve(w.account(), uint64_t{1} << 50));
  EXPECT_EQ(w.pod_used, uint64_t{1} << 50);
}

TEST(PodLedger, RefusesAReservationThatWouldOverflow) {
  Words w;
  w.pod_used = UINT64_MAX - 5;
  EXPECT_FALSE(PodLedger::try_reserve(w.account(), 10));
  EXPECT_EQ(w.pod_used, UINT64_MAX - 5);
}

TEST(PodLedger, ReleaseSaturatesAtZero) {
  Words w;
  w.cap = 100;
  ASSERT_TRUE(PodLedger::try_reserve(w.account(), 30));
  w.pod_used = 10;  // the arbiter reclaimed part of it meanwhile
  PodLedger::release(w.account(), 30);
  EXPECT_EQ(w.pod_used, 0u);
  EXPECT_EQ(w.process_used, 0u);
}

TEST(PodLedger, CapLoweredBelowUsageLeavesNoRoomAndNoUnderflow) {
  Words w;
  w.cap = 100;
  ASSERT_TRUE(PodLedger::try_reserve(w.account(), 80));
  w.cap = 50;
  EXPECT_EQ(PodLedger::room(w.account()), 0u);
  EXPECT_FALSE(PodLedger::try_reserve(w.account(), 1));
}

TEST(PodLedger, RacingThreadsNeverPassTheCap) {
  // Every reservation is 60 bytes under a 100-byte cap: only one can be held at a time,
  // so two threads passing a check-then-add together show up at once as 120.
  Words w;
  constexpr uint64_t kCap = 100;
  w.cap = kCap;
  std::atomic<uint64_t> max_used{0};
  std::atomic<uint64_t> denials{0};
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      ready++;
      while (ready.load() < 4) std::this_thread::yield();
      for (int i = 0; i < 200000; ++i) {
        if (!PodLedger::try_reserve(w.account(), 60)) {
          denials++;
          continue;
        }
        const uint64_t now = w.pod_used.load();
        uint64_t seen = max_used.load();
        while (seen < now && !max_used.compare_exchange_weak(seen, now)) {
        }
        PodLedger::release(w.account(), 60);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_LE(max_used.load(), kCap);
  EXPECT_GT(denials.load(), 0u) << "the threads never contended";
  EXPECT_EQ(w.pod_used, 0u);
}

TEST(AllocationTable, ReturnsWhatWasInsertedOnce) {
  AllocationTable table;
  CUcontext ctx = reinterpret_cast<CUcontext>(0x1000);
  ASSERT_TRUE(table.insert(Resource::device_memory, 0x7f0000, Allocation{4096, 1, ctx}));
  Allocation found;
  ASSERT_TRUE(table.find(Resource::device_memory, 0x7f0000, &found));
  EXPECT_EQ(found.bytes, 4096u);
  EXPECT_EQ(found.device, 1);
  EXPECT_FALSE(table.find(Resource::array, 0x7f0000, &found))
      << "resources have separate key spaces";
  ASSERT_TRUE(table.remove(Resource::device_memory, 0x7f0000, &found));
  EXPECT_EQ(found.context, ctx);
  EXPECT_FALSE(table.remove(Resource::device_memory, 0x7f0000, &found))
      << "a second free finds nothing";
  EXPECT_EQ(table.live(), 0u);
}

TEST(AllocationTable, UnknownKeysAreNotFoundInAnEmptyOrBusyTable) {
  AllocationTable table;
  Allocation found;
  EXPECT_FALSE(table.remove(Resource::device_memory, 42, &found));
  for (uint64_t k = 1; k <= 1000; ++k)
    ASSERT_TRUE(table.insert(Resource::device_memory, k << 12, {k, 0, nullptr}));
  EXPECT_FALSE(table.find(Resource::device_memory, 999999, &found));
  for (uint64_t k = 1; k <= 1000; ++k) {
    ASSERT_TRUE(table.remove(Resource::device_memory, k << 12, &found));
    EXPECT_EQ(found.bytes, k);
  }
}

TEST(AllocationTable, RemovesEverythingOfAContext) {
  AllocationTable table;
  auto* a = reinterpret_cast<CUcontext>(0xa000);
  auto* b = reinterpret_cast<CUcontext>(0xb000);
  for (uint64_t k = 1; k <= 100; ++k)
    table.insert(Resource::device_memory, k, {10, 0, k % 2 ? a : b});
  table.insert(Resource::array, 7, {5, 0, a});
  table.insert(Resource::generic_handle, 9, {3, 0, nullptr});
  uint64_t returned = 0;
  int entries = 0;
  table.remove_context(a, [&](Resource, uint64_t, const Allocation& allocation) {
    returned += allocation.bytes;
    ++entries;
  });
  EXPECT_EQ(entries, 51);
  EXPECT_EQ(returned, 505u);
  EXPECT_EQ(table.live(), 51u);
}

TEST(AllocationTable, FullTableRefusesInsteadOfCorrupting) {
  AllocationTable table;
  uint32_t inserted = 0;
  while (table.insert(Resource::device_memory, (uint64_t{inserted} + 1) * 256, {1, 0, nullptr}))
    ++inserted;
  EXPECT_EQ(inserted, AllocationTable::kMaxLive);
  Allocation found;
  EXPECT_TRUE(table.find(Resource::device_memory, 256, &found));
  EXPECT_TRUE(table.remove(Resource::device_memory, 256, &found));
  EXPECT_TRUE(table.insert(Resource::device_memory, 1, {1, 0, nullptr}))
      << "a freed slot is reused";
}

TEST(AllocationTable, ConcurrentInsertsAndRemovesKeepEveryEntry) {
  AllocationTable table;
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < 20000; ++i) {
        const uint64_t key = (uint64_t{static_cast<uint64_t>(t)} << 40) | (i % 512) << 12;
        if (!table.insert(Resource::device_memory, key, {i, t, nullptr})) mismatches++;
        Allocation found;
        if (!table.remove(Resource::device_memory, key, &found) || found.bytes != i ||
            found.device != t)
          mismatches++;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(table.live(), 0u);
}

TEST(Options, ParsesByteSizesWithBinarySuffixes) {
  uint64_t bytes = 0;
  EXPECT_TRUE(parse_byte_size("1048576", &bytes));
  EXPECT_EQ(bytes, 1048576u);
  EXPECT_TRUE(parse_byte_size("300Mi", &bytes));
  EXPECT_EQ(bytes, 300ull << 20);
  EXPECT_TRUE(parse_byte_size("2Gi", &bytes));
  EXPECT_EQ(bytes, 2ull << 30);
  EXPECT_FALSE(parse_byte_size("", &bytes));
  EXPECT_FALSE(parse_byte_size("12MB", &bytes));
  EXPECT_FALSE(parse_byte_size("-1", &bytes));
  EXPECT_FALSE(parse_byte_size("99999999999999999999", &bytes));
  EXPECT_FALSE(parse_byte_size("20000000Ti", &bytes));
}

}  // namespace
}  // namespace quanta::shim
