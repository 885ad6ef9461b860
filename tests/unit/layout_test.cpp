// The shared-memory and wire layouts are ABI between separately built binaries (a shim
// in an old container image, a newer arbiter): pin their sizes and offsets.
#include <gtest/gtest.h>

#include <cstddef>

#include "common/shm_layout.h"
#include "common/wire.h"

using namespace quanta::common;

TEST(SharedLayout, ControlRegionFieldsKeepTheirOffsets) {
  EXPECT_EQ(sizeof(ControlSlot), 64u);
  EXPECT_EQ(offsetof(ControlRegion, slots) % 64, 0u);
  EXPECT_EQ(offsetof(ControlSlot, turn), 0u);
  EXPECT_EQ(offsetof(ControlSlot, owner), 4u);
  EXPECT_EQ(offsetof(ControlSlot, end_at_ns), 8u);
  EXPECT_EQ(offsetof(ControlHeader, uuid), 16u);
}

TEST(SharedLayout, PodRegionFitsAndAligns) {
  EXPECT_EQ(sizeof(GateChannel), 64u);
  EXPECT_EQ(offsetof(PodRegion, memory_used) % 64, 0u);
  EXPECT_EQ(offsetof(PodRegion, memory_cap) % 64, 0u);
  EXPECT_EQ(sizeof(GateLimits), 32u);
  EXPECT_EQ(sizeof(ProcEntry), 64u + kMaxGpus * (sizeof(GateChannel) + sizeof(GateLimits)));
  EXPECT_LT(sizeof(PodRegion), 512u * 1024u);
}

TEST(WireProtocol, MessagesCarrySizeAndVersion) {
  auto h = make_header<AttachMessage>(MessageType::kAttach);
  EXPECT_EQ(h.magic, kWireMagic);
  EXPECT_EQ(h.version, kWireVersion);
  EXPECT_EQ(h.size, sizeof(AttachMessage));
}
