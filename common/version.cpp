#include "common/version.h"

#include "common/shm_layout.h"
#include "common/wire.h"

namespace quanta::common {

const char* release() { return QUANTA_VERSION; }

std::string version_line(const char* tool) {
  return std::string(tool) + " " + release() + " (shared-memory layout " +
         std::to_string(kLayoutVersion) + ", tenant protocol " + std::to_string(kWireVersion) +
         ")";
}

}  // namespace quanta::common
