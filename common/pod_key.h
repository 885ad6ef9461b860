// Pod keys as the arbiter keeps them and as operators type them: "namespace/name" for a
// registered pod, the bare QUANTA_POD name of a development process, "uid:<uid>" for a
// registration without a name. quantactl's commands and quanta-trace's --pod resolve a name
// the same way.
#pragma once

#include <set>
#include <string>
#include <utility>

namespace quanta::common {

// "ns/name" -> ("ns", "name"); a key without '/' (a development pod named by QUANTA_POD)
// is ("default", key); "uid:<uid>" (a registration without a name) is ("", key).
std::pair<std::string, std::string> split_pod_key(const std::string& key);

// A pod as an operator names it: its key exactly, its "namespace/name" (default/NAME for a
// QUANTA_POD pod), or its name alone when no other pod in `known` has that name. Returns
// the key, or "" with `*error` saying why when the name is ambiguous (listing the pods);
// "" with `*error` empty when no pod has it.
std::string resolve_pod_name(const std::set<std::string>& known, const std::string& wanted,
                             std::string* error);

}  // namespace quanta::common
