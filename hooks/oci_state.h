// The OCI state a runtime writes on a hook's stdin (runtime-spec "State"): which container,
// at which stage's view (its pid is the host pid at createRuntime, the container's own or 0
// at createContainer, absent at poststop), and where its bundle is.
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace quanta::hooks {

struct OciState {
  std::string id;
  std::string status;
  int pid = 0;         // 0 when the state has none
  std::string bundle;  // absolute path of the bundle folder
  std::map<std::string, std::string> annotations;
};

// Parses and checks the state; throws HookError naming the field that is missing or wrong.
OciState parse_oci_state(std::string_view text);
// Reads the state from `fd` (at most 1 MiB) and parses it.
OciState read_oci_state(int fd);

}  // namespace quanta::hooks
