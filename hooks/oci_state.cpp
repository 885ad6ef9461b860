// OCI state parsing with nlohmann-json: a malformed or hostile state is a HookError naming
// the field, never a crash (fuzzed by tests/fuzz/oci_state_fuzz.cpp).
#include "hooks/oci_state.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "hooks/error.h"
#include "hooks/json_fields.h"

namespace quanta::hooks {

constexpr size_t kMaxStateBytes = 1 << 20;

OciState parse_oci_state(std::string_view text) {
  nlohmann::json j = parse_json_object(text, "the OCI state on stdin");
  OciState s;
  optional_string(j, "ociVersion", "the OCI state");  // checked (a string if present), not used
  s.id = required_string(j, "id", "the OCI state");
  check_container_id(s.id);
  s.status = optional_string(j, "status", "the OCI state");
  if (j.contains("pid") && !j["pid"].is_null()) {
    const nlohmann::json& pid = j["pid"];
    if (!pid.is_number_integer() || pid.get<int64_t>() < 0 || pid.get<int64_t>() > (1 << 30))
      throw HookError("the OCI state's pid is " + shown(pid.dump()) +
                      ": expected a process id (a whole number from 0)");
    s.pid = static_cast<int>(pid.get<int64_t>());
  }
  s.bundle = required_string(j, "bundle", "the OCI state");
  if (s.bundle[0] != '/')
    throw HookError("the OCI state's bundle is " + shown(s.bundle) + ": expected an absolute path");
  s.annotations = string_map(j, "annotations", "the OCI state");
  return s;
}

OciState read_oci_state(int fd) {
  std::string text;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      throw HookError(std::string("cannot read the OCI state on stdin: ") + std::strerror(errno));
    }
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxStateBytes)
      throw HookError("the OCI state on stdin is longer than 1 MiB");
  }
  if (text.empty())
    throw HookError(
        "no OCI state on stdin: quanta-hook oci … is run by a container runtime as an OCI hook");
  return parse_oci_state(text);
}

}  // namespace quanta::hooks
