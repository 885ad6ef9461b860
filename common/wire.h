// The tenant socket's wire protocol (SOCK_SEQPACKET, one message per packet, fixed-size
// little-endian structs; the arbiter's replies carry file descriptors in SCM_RIGHTS, a
// tenant's messages never may: the arbiter's socket refuses them). The arbiter identifies
// a caller by the live process behind the connection (a pidfd) and its cgroup, never by
// what a message claims.
#pragma once

#include <cstdint>

#include "common/shm_layout.h"

namespace quanta::common {

constexpr uint32_t kWireMagic = 0x5751514eu;  // "NQQW"
// 4: the shim speaks shared-memory layout 3 (AttachedMessage::owner). 3: the same messages,
// spoken by shims of layout 2 (AttachedMessage::owner was reserved); the arbiter still
// serves them (common/version.h).
constexpr uint32_t kWireVersion = 4;
constexpr size_t kMessageTextLen = 256;

enum class MessageType : uint32_t {
  kHello = 1,      // tenant → arbiter, first message of a connection
  kWelcome = 2,    // arbiter → tenant; fds: [pod region O_RDWR, doorbell eventfd]
  kRefused = 3,    // arbiter → tenant; text says why; the tenant runs ungated
  kAttach = 4,     // tenant → arbiter: "I use this GPU"
  kAttached = 5,   // arbiter → tenant; fds: [control region O_RDONLY] (first attach of a GPU)
  kAttachFailed = 6,  // arbiter → tenant; text says why, action what to do on that GPU
};

struct MessageHeader {
  uint32_t magic;
  uint32_t version;
  MessageType type;
  uint32_t size;  // bytes of the whole message
};

struct HelloMessage {
  MessageHeader header;
  // QUANTA_POD of a host process; honoured only when the node config allows
  // unregistered processes and the caller is not in a registered container.
  char claimed_pod[kPodKeyLen];
};

// WelcomeMessage::flags
constexpr uint32_t kWelcomeEnforced = 1u << 0;  // ignore QUANTA_* variables that loosen limits
// This process's entry was made afresh (empty words) by this Hello, not kept from before (a
// reconnect, or a restart that re-adopted it): whatever the process holds is charged nowhere
// until its shim charges it again, even where the entry's index is the one it had before.
constexpr uint32_t kWelcomeFreshEntry = 1u << 1;

struct WelcomeMessage {
  MessageHeader header;
  uint32_t pod_index;
  uint32_t proc_index;         // this process's entry in the pod region
  uint64_t arbiter_generation;
  char pod_key[kPodKeyLen];
  // The node's shim settings ([shim] and [enforce] in the node config).
  uint32_t flags;
  uint32_t count_managed;      // 1: cuMemAllocManaged counts against the cap
  uint64_t context_overhead;   // bytes charged per CUDA context
};

// RefusedMessage::action: what the refused process must do.
enum class RefusedAction : uint32_t {
  kRunOpen = 0,  // run ungated and uncapped
  kDeny = 1,     // the node enforces: refuse CUDA to this process
};

struct RefusedMessage {
  MessageHeader header;
  RefusedAction action;
  uint32_t reserved;
  char reason[kMessageTextLen];
};

// AttachMessage::flags
// Memory views only: a process that uses NVML and no CUDA (nvidia-smi, an exporter) reads
// its pod's usage and cap without becoming a tenant. It gets no slot and is never scheduled.
constexpr uint32_t kAttachObserve = 1u << 0;
// The process rings the doorbell when its queued work on this GPU runs out while it holds
// the GPU and others wait, so the arbiter need not keep looking at a busy holder for idleness.
constexpr uint32_t kAttachReportsQuiet = 1u << 1;
// The process also rings when it was granted this GPU while others waited and launched
// nothing for ControlHeader::idle_release_ns, so the arbiter need not wake to look at a
// fresh grant: it looks at such a holder no sooner than its next deadline.
constexpr uint32_t kAttachReportsUnusedGrant = 1u << 2;
// The process ends its own turn when ControlSlot::end_at_ns passes and others still wait
// (see ControlSlot's protocol), so the arbiter need not wake at the quantum's end or wake the
// holder to revoke it: it revokes only as a backstop, a grace period later.
constexpr uint32_t kAttachEndsOwnQuantum = 1u << 3;

struct AttachMessage {
  MessageHeader header;
  char uuid[kUuidLen];  // the device's UUID as cuDeviceGetUuid formats it ("GPU-…"/"MIG-…")
  uint32_t flags;
  uint32_t reserved;
};

struct AttachedMessage {
  MessageHeader header;
  uint32_t gpu_index;   // index into PodRegion::memory_used and ProcEntry::gpus
  uint32_t slot;        // this process's ControlSlot on that GPU; kNoSlot for an observer
  uint32_t fd_attached; // 1 when a control-region fd travels with this message
  uint32_t owner;       // ControlSlot::owner while the slot is this process's; 0 for an observer
  uint64_t memory_cap;  // the pod's cap on that GPU when it was sent (observers' views)
};

struct AttachFailedMessage {
  MessageHeader header;
  char reason[kMessageTextLen];
  // kRunOpen: use that GPU ungated and uncapped; kDeny: the node enforces, refuse CUDA on it.
  RefusedAction action;
  uint32_t reserved;
};

template <typename T>
constexpr MessageHeader make_header(MessageType type) {
  return MessageHeader{kWireMagic, kWireVersion, type, static_cast<uint32_t>(sizeof(T))};
}

}  // namespace quanta::common
