// The admin socket's requests (docs/quantactl-status.md): one JSON line in, one typed
// request or one line saying what is wrong and what is allowed. Pure, so it is fuzzed; the
// arbiter acts on what this returns and never on raw JSON.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/state/registration.h"

namespace quanta::arbiter {

struct AdminRequest {
  enum class Command { kStatus, kTop, kExplain, kSet, kUnset, kPolicy, kRegister, kUnregister,
                       kDrain, kUndrain, kDevices };
  Command command = Command::kStatus;
  std::string pod;                            // set, unset, policy (optional), explain
  double seconds = 60;                        // explain: how far back, 1-60
  std::string gpu;                            // drain, undrain: an index or a UUID
  std::map<std::string, std::string> values;  // set: policy values as text
  std::vector<std::string> keys;              // unset: the keys to remove (none: all)
  Registration registration;                  // register
  std::string container_id;                   // unregister
};

// Parses one request line (without its newline). Returns "" and fills `out`, or the error.
// Field values are checked for type and for being printable text here; policy values and
// names are checked where they take effect (PodRegistry), with the same messages.
std::string parse_admin_request(std::string_view line, AdminRequest* out);

}  // namespace quanta::arbiter
