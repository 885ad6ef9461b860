// What a build of Quanta is: its release, and the versions of the interfaces its parts
// speak to each other (the shared-memory layout, the tenant wire protocol), with the range
// of each that its arbiter accepts. This is the one list: the arbiter checks shims and
// regions against it, `--version` and `quantactl status` print it, and the versions table
// in docs/operator-guide.md ("Upgrade and roll back") follows it.
#pragma once

#include <cstdint>
#include <string>

#include "common/shm_layout.h"
#include "common/wire.h"

namespace quanta::common {

// The release, as the build's project version gives it ("0.2.0").
const char* release();

struct InterfaceVersions {
  const char* name;  // as messages say it: "tenant protocol"
  uint32_t speaks;   // what this release's shim and arbiter write
  uint32_t oldest;   // the oldest the arbiter accepts from a shim or a region it finds
  uint32_t newest;   // the newest it accepts
  constexpr bool accepts(uint32_t version) const { return version >= oldest && version <= newest; }
};

// The tenant socket's messages (common/wire.h) between libquanta.so and the arbiter.
inline constexpr InterfaceVersions kTenantProtocol{"tenant protocol", kWireVersion, 3, 4};
// The control and pod regions (common/shm_layout.h; layout 2: common/shm_layout_2.h) both map.
inline constexpr InterfaceVersions kSharedMemoryLayout{"shared-memory layout", kLayoutVersion, 2, 3};

// The shared-memory layout a shim of tenant protocol `protocol` maps: 3 for protocol 4, 2 for
// protocol 3; 0 for a protocol the arbiter does not accept.
constexpr uint32_t layout_of_protocol(uint32_t protocol) {
  return protocol == 4 ? 3 : protocol == 3 ? 2 : 0;
}
static_assert(layout_of_protocol(kWireVersion) == kLayoutVersion);

// "shared-memory layout 3, tenant protocol 3": what a release speaks.
std::string interface_versions();
// "3" or "2 to 3": what the arbiter accepts of one interface.
std::string accepted_range(const InterfaceVersions& v);
// "quanta-arbiter 0.2.0 (shared-memory layout 3, tenant protocol 4)".
std::string version_line(const char* tool);

}  // namespace quanta::common
