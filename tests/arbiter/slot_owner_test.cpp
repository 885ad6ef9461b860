// The owner words of control slots: SipHash-2-4 as its authors' reference vectors give it,
// words that differ per process and GPU and are never 0, and the key's text in the state file.
#include "arbiter/state/slot_owner.h"

#include <gtest/gtest.h>

#include <set>

using quanta::arbiter::new_slot_key;
using quanta::arbiter::parse_slot_key;
using quanta::arbiter::siphash24;
using quanta::arbiter::slot_key_text;
using quanta::arbiter::slot_owner;
using quanta::arbiter::SlotKey;

// The reference test vectors: key 00 01 .. 0f, messages 00 01 .. (n-1).
TEST(SlotOwner, SipHashMatchesTheReferenceVectors) {
  const SlotKey key{0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
  unsigned char message[16];
  for (unsigned i = 0; i < sizeof(message); ++i) message[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(siphash24(key, message, 0), 0x726fdb47dd0e0e31ull);
  EXPECT_EQ(siphash24(key, message, 1), 0x74f839c593dc67fdull);
  EXPECT_EQ(siphash24(key, message, 8), 0x93f5f5799a932462ull);
  EXPECT_EQ(siphash24(key, message, 15), 0xa129ca6149be45e5ull);
}

TEST(SlotOwner, WordsDifferPerProcessAndGpuAndPerKeyAndAreNeverZero) {
  const SlotKey key = new_slot_key();
  std::set<uint32_t> seen;
  for (uint32_t pid = 100; pid < 140; ++pid) {
    for (uint32_t gpu = 0; gpu < 4; ++gpu) {
      const uint32_t owner = slot_owner(key, static_cast<pid_t>(pid), 3, 1, gpu);
      EXPECT_NE(owner, 0u);
      seen.insert(owner);
    }
  }
  EXPECT_EQ(seen.size(), 160u);
  EXPECT_EQ(slot_owner(key, 100, 3, 1, 0), slot_owner(key, 100, 3, 1, 0)) << "not a function of its inputs";
  EXPECT_NE(slot_owner(key, 100, 3, 1, 0), slot_owner(key, 100, 4, 1, 0)) << "the pod region is not in it";
  EXPECT_NE(slot_owner(key, 100, 3, 1, 0), slot_owner(key, 100, 3, 2, 0)) << "the entry is not in it";
  EXPECT_NE(slot_owner(key, 100, 3, 1, 0), slot_owner(new_slot_key(), 100, 3, 1, 0)) << "the key is not in it";
}

TEST(SlotOwner, TheKeyReadsBackFromItsTextAndNothingElseIsAKey) {
  const SlotKey key = new_slot_key();
  SlotKey back{};
  ASSERT_TRUE(parse_slot_key(slot_key_text(key), &back));
  EXPECT_EQ(back, key);
  for (const char* bad : {"", "00", "0123456789abcdef0123456789abcdeg", "0123456789ABCDEF0123456789abcdef",
                          "0123456789abcdef0123456789abcdef0"})
    EXPECT_FALSE(parse_slot_key(bad, &back)) << bad;
}
