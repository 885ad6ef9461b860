// Which line of /proc/<pid>/cgroup tells one container from another. The arbiter (placing
// a tenant) and quanta-hook (registering its container) both go through this one rule, so
// they name a container's cgroup the same way on cgroup v2, v1 and hybrid hosts.
#pragma once

#include <string_view>

namespace quanta::common {

// The unified (v2) path, unless it is the root while a v1 controller's path is deeper: a
// hybrid host whose runtime put the container in v1 hierarchies only. Then the memory
// controller's path (every Kubernetes v1 node has it), else the first v1 path below the
// root. A process at the root everywhere gets "/". Empty when no line parses. The result
// points into `text`.
inline std::string_view container_cgroup_path(std::string_view text) {
  std::string_view unified;
  std::string_view memory;
  std::string_view first_v1;
  std::string_view any_root;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    // "ID:CONTROLLERS:PATH"; the path may itself hold ':' (it is everything after the second).
    const size_t a = line.find(':');
    if (a == std::string_view::npos) continue;
    const size_t b = line.find(':', a + 1);
    if (b == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, a);
    const std::string_view controllers = line.substr(a + 1, b - a - 1);
    const std::string_view path = line.substr(b + 1);
    if (path.empty() || path[0] != '/') continue;
    if (path == "/") {
      if (any_root.empty()) any_root = path;
      if (id == "0" && controllers.empty()) unified = path;
      continue;
    }
    if (id == "0" && controllers.empty()) {
      unified = path;
      continue;
    }
    // v1 controllers are comma lists ("cpu,cpuacct"); named hierarchies are "name=...".
    bool is_memory = false;
    for (std::string_view rest = controllers; !rest.empty();) {
      const size_t comma = rest.find(',');
      if (rest.substr(0, comma) == "memory") is_memory = true;
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
    if (is_memory && memory.empty()) memory = path;
    if (first_v1.empty()) first_v1 = path;
  }
  if (!unified.empty() && unified != "/") return unified;
  if (!memory.empty()) return memory;
  if (!first_v1.empty()) return first_v1;
  return any_root;
}

}  // namespace quanta::common
