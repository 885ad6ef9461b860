#include "common/version.h"

namespace quanta::common {

static_assert(kTenantProtocol.accepts(kTenantProtocol.speaks),
              "an arbiter accepts the tenant protocol its own shim speaks");
static_assert(kSharedMemoryLayout.accepts(kSharedMemoryLayout.speaks),
              "an arbiter accepts the layout its own regions have");

const char* release() { return QUANTA_VERSION; }

std::string interface_versions() {
  return std::string(kSharedMemoryLayout.name) + " " + std::to_string(kSharedMemoryLayout.speaks) +
         ", " + kTenantProtocol.name + " " + std::to_string(kTenantProtocol.speaks);
}

std::string accepted_range(const InterfaceVersions& v) {
  if (v.oldest == v.newest) return std::to_string(v.oldest);
  return std::to_string(v.oldest) + " to " + std::to_string(v.newest);
}

std::string version_line(const char* tool) {
  return std::string(tool) + " " + release() + " (" + interface_versions() + ")";
}

}  // namespace quanta::common
