// What a build of Quanta is: its release, and the versions of the interfaces its parts
// speak to each other (the shared-memory layout, the tenant wire protocol). Every tool's
// `--version` prints version_line().
#pragma once

#include <string>

namespace quanta::common {

// The release, as the build's project version gives it ("0.1.0").
const char* release();

// "quanta-arbiter 0.1.0 (shared-memory layout 3, tenant protocol 3)".
std::string version_line(const char* tool);

}  // namespace quanta::common
