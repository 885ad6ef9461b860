// Feeds arbitrary packets to the tenant message parser (what any process on the node can
// send): it accepts exactly the well-formed Hello and Attach messages, and what it hands on
// is bounded by the wire's field sizes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "arbiter/serving/tenant_protocol.h"
#include "common/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using quanta::arbiter::TenantMessage;
  const bool truncated = size > 0 && (data[0] & 0x80) != 0 && size % 7 == 0;
  TenantMessage m;
  const std::string err = quanta::arbiter::parse_tenant_message(data, size, truncated, &m);
  if (err.empty()) {
    if (truncated) std::abort();
    if (m.kind == TenantMessage::Kind::kHello &&
        (size != sizeof(quanta::common::HelloMessage) ||
         m.claimed_pod.size() >= quanta::common::kPodKeyLen))
      std::abort();
    if (m.kind == TenantMessage::Kind::kAttach && (size != sizeof(quanta::common::AttachMessage) ||
                                                   m.uuid.size() >= quanta::common::kUuidLen))
      std::abort();
  }
  return 0;
}
