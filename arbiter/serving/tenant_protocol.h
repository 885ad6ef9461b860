// The tenant socket's messages as the arbiter reads them (common/wire.h): one packet in,
// either a Hello or an Attach with its text fields checked, or one line saying why the
// packet is refused. Pure, so it is fuzzed; which message may come when is the server's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace quanta::arbiter {

struct TenantMessage {
  enum class Kind { kHello, kAttach };
  Kind kind = Kind::kHello;
  // The tenant protocol the packet speaks (an accepted one; see common/version.h): the
  // arbiter answers in it, and a Hello's says which shared-memory layout the process maps.
  uint32_t version = 0;
  std::string claimed_pod;            // Hello: QUANTA_POD of a host process ("" when none)
  std::string uuid;                   // Attach: the device's UUID
  bool observe = false;               // Attach: memory views only (kAttachObserve), never a slot
  bool reports_quiet = false;         // Attach: kAttachReportsQuiet
  bool reports_unused_grant = false;  // Attach: kAttachReportsUnusedGrant
  bool ends_own_quantum = false;      // Attach: kAttachEndsOwnQuantum
  // A packet of a tenant protocol this arbiter does not accept (common/version.h): the
  // version its header says, so the server can tell the process why; 0 otherwise.
  uint32_t other_version = 0;
};

// `truncated`: the kernel cut the packet or its control data (MSG_TRUNC/MSG_CTRUNC).
// Returns "" and fills `out`, or the refusal (for another protocol version, a line naming
// both versions and what the operator should do, with `out->other_version` set).
std::string parse_tenant_message(const void* data, size_t size, bool truncated, TenantMessage* out);

// Why a process whose shim speaks tenant protocol `version`, which this arbiter does not
// accept, is refused: both versions, and what the operator should do.
std::string other_protocol_refusal(uint32_t version);

}  // namespace quanta::arbiter
