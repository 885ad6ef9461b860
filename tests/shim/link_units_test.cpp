// Unit tests of the arbiter link's context table (shim/link/contexts.cpp), in-process over stubs
// of the rooms it calls (session: every context binds to device 0's binding; devices; of the
// real driver only the device count and the current context, so draining does nothing).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "shim/base/log.h"
#include "shim/link/link_state.h"

namespace quanta::shim {

Process g_process;
Binding g_bindings[kMaxGpus];
QUANTA_TLS constinit bool t_in_link = false;

bool ensure_linked() {
  return true;
}
Binding* ensure_binding(CUdevice device) {
  return &g_bindings[device];
}
bool context_device(CUcontext, CUdevice* device) noexcept {
  *device = 0;
  return true;
}
// The driver entries the table asks for itself: how many devices the process sees, and the
// current context (counted, so a test can tell whether a lookup asked the driver).
int g_devices_seen = 1;
CUcontext g_current = nullptr;
int g_current_asked = 0;
CUresult fake_device_count(int* count) {
  *count = g_devices_seen;
  return CUDA_SUCCESS;
}
CUresult fake_current(CUcontext* context) {
  ++g_current_asked;
  *context = g_current;
  return CUDA_SUCCESS;
}
void* real_driver_symbol(const char* name) noexcept {
  if (std::string(name) == "cuDeviceGetCount") return reinterpret_cast<void*>(&fake_device_count);
  if (std::string(name) == "cuCtxGetCurrent") return reinterpret_cast<void*>(&fake_current);
  return nullptr;
}
bool log_enabled(LogLevel) noexcept {
  return false;
}
void log_write(LogLevel, const char*, ...) noexcept {}

namespace {

CUcontext fake_context(uint64_t n) {
  return reinterpret_cast<CUcontext>((n + 1) << 12);
}

Binding* lookup(CUcontext context) {
  return binding_for_context_slow(context, g_process.epoch.load());
}

TEST(ContextTable, DestroyedContextsLeaveRoomForNewOnes) {
  contexts_reset_in_child();
  // Far more contexts over the process's life than the table holds, never more than one
  // alive: each new one must still be gated (have a binding).
  for (uint64_t n = 0; n < 5 * kMaxContexts; ++n) {
    const CUcontext context = fake_context(n);
    ASSERT_EQ(lookup(context), &g_bindings[0]) << "context " << n << " got no binding";
    link_forget_context(context);
  }
  EXPECT_EQ(lookup(fake_context(99999)), &g_bindings[0]);
}

TEST(ContextTable, ReusedEntriesNeverAnswerForTheirOldContext) {
  contexts_reset_in_child();
  for (uint64_t n = 0; n < kMaxContexts; ++n) ASSERT_NE(lookup(fake_context(n)), nullptr);
  for (uint64_t n = 0; n < kMaxContexts; ++n) link_forget_context(fake_context(n));
  // A full table of dead entries: new contexts take them over one by one, while a
  // forgotten one looked up again gets an entry of its own (a new context at that address).
  for (uint64_t n = 0; n < kMaxContexts / 2; ++n)
    ASSERT_NE(lookup(fake_context(kMaxContexts + n)), nullptr);
  EXPECT_EQ(lookup(fake_context(3)), &g_bindings[0]);
  EXPECT_EQ(lookup(fake_context(kMaxContexts + 1)), &g_bindings[0]);
}

TEST(ContextTable, MoreLiveContextsThanEntriesRunUngatedWithoutCorruption) {
  contexts_reset_in_child();
  for (uint64_t n = 0; n < kMaxContexts; ++n) ASSERT_NE(lookup(fake_context(n)), nullptr);
  EXPECT_EQ(lookup(fake_context(kMaxContexts)), nullptr);
  link_forget_context(fake_context(7));
  EXPECT_NE(lookup(fake_context(kMaxContexts)), nullptr) << "a freed entry is reused";
}

// A process that sees one device: once a launch found its binding, launches with no
// context given (the current one) go through that binding without asking the driver, so a
// launch wrapper need not read the current context at all.
TEST(ContextTable, AProcessThatSeesOneDeviceFindsItsGateWithoutTheCurrentContext) {
  contexts_reset_in_child();
  g_devices_seen = 1;
  EXPECT_EQ(g_sole_binding.load(), nullptr) << "known before any context was looked up";
  g_current = fake_context(7);
  ASSERT_EQ(lookup(fake_context(7)), &g_bindings[0]);
  EXPECT_NE(g_sole_binding.load(), nullptr);
  g_current_asked = 0;
  for (int launch = 0; launch < 10; ++launch)
    EXPECT_EQ(binding_for_context(nullptr), &g_bindings[0]);
  EXPECT_EQ(g_current_asked, 0) << "the driver was asked for the current context";

  // A forked child asks again.
  contexts_reset_in_child();
  EXPECT_EQ(g_sole_binding.load(), nullptr);
}

// Several devices: a context's device decides the gate, so the current context is read.
TEST(ContextTable, AProcessThatSeesSeveralDevicesReadsTheCurrentContext) {
  contexts_reset_in_child();
  g_devices_seen = 2;
  g_current = fake_context(8);
  ASSERT_EQ(lookup(fake_context(8)), &g_bindings[0]);
  EXPECT_EQ(g_sole_binding.load(), nullptr);
  g_current_asked = 0;
  EXPECT_EQ(binding_for_context(nullptr), &g_bindings[0]);
  EXPECT_EQ(g_current_asked, 1);
  g_devices_seen = 1;
  contexts_reset_in_child();
}

}  // namespace
}  // namespace quanta::shim
