// Validation of tenant packets: header, exact size per type, NUL-terminated text.
#include "arbiter/serving/tenant_protocol.h"

#include <cstring>

#include "common/version.h"
#include "common/wire.h"

namespace quanta::arbiter {
namespace {

bool nul_terminated(const char* s, size_t cap) {
  return std::memchr(s, '\0', cap) != nullptr;
}

}  // namespace

std::string other_protocol_refusal(uint32_t version) {
  const common::InterfaceVersions& v = common::kTenantProtocol;
  const std::string accepted = common::accepted_range(v);
  return "its libquanta.so speaks tenant protocol " + std::to_string(version) +
         "; this arbiter (release " + common::release() + ") speaks " + std::to_string(v.speaks) +
         " and accepts " + accepted + ": " +
         (version < v.oldest
              ? "restart the pod, so that its containers load the libquanta.so installed with "
                "this arbiter, or run an arbiter release that accepts protocol " +
                    std::to_string(version)
              : "this arbiter is older than the pod's libquanta.so: run the arbiter release "
                "installed with that library (or newer), or restart the pod under this one");
}

std::string parse_tenant_message(const void* data, size_t size, bool truncated,
                                 TenantMessage* out) {
  using common::MessageType;
  if (truncated) return "oversized packet";
  if (data == nullptr || size < sizeof(common::MessageHeader)) {
    return "packet of " + std::to_string(size) + " bytes is shorter than a message header";
  }
  common::MessageHeader header;
  std::memcpy(&header, data, sizeof(header));
  if (header.magic != common::kWireMagic) return "bad magic (not the Quanta protocol)";
  if (!common::kTenantProtocol.accepts(header.version)) {
    out->other_version = header.version;
    return other_protocol_refusal(header.version);
  }
  out->version = header.version;
  if (header.size != size) {
    return "header says " + std::to_string(header.size) + " bytes, packet has " +
           std::to_string(size);
  }
  switch (header.type) {
    case MessageType::kHello: {
      if (size != sizeof(common::HelloMessage)) return "Hello of the wrong size";
      common::HelloMessage hello;
      std::memcpy(&hello, data, sizeof(hello));
      if (!nul_terminated(hello.claimed_pod, sizeof(hello.claimed_pod)))
        return "Hello's pod name is not NUL-terminated";
      out->kind = TenantMessage::Kind::kHello;
      out->claimed_pod = hello.claimed_pod;
      return "";
    }
    case MessageType::kAttach: {
      if (size != sizeof(common::AttachMessage)) return "Attach of the wrong size";
      common::AttachMessage attach;
      std::memcpy(&attach, data, sizeof(attach));
      if (!nul_terminated(attach.uuid, sizeof(attach.uuid)))
        return "Attach's UUID is not NUL-terminated";
      out->kind = TenantMessage::Kind::kAttach;
      out->uuid = attach.uuid;
      out->observe = (attach.flags & common::kAttachObserve) != 0;
      out->reports_quiet = (attach.flags & common::kAttachReportsQuiet) != 0;
      out->reports_unused_grant = (attach.flags & common::kAttachReportsUnusedGrant) != 0;
      out->ends_own_quantum = (attach.flags & common::kAttachEndsOwnQuantum) != 0;
      return "";
    }
    default:
      return "unexpected message type " + std::to_string(static_cast<uint32_t>(header.type));
  }
}

}  // namespace quanta::arbiter
