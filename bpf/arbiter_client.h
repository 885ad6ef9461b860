// How `quanta-trace session` talks to an arbiter it found: the admin socket is the arbiter
// process's listening stream socket (from /proc/<pid>/net/unix), reached through
// /proc/<pid>/root so it works across mount namespaces, and asked for `status`.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace quanta::bpf {

// The path (in the arbiter's mount namespace) of the admin socket of arbiter `pid`.
std::optional<std::string> find_admin_socket(pid_t pid);

// The arbiter's `status` response (docs/quantactl-status.md); nullopt with `error` set
// when the socket cannot be reached or answers with something else.
std::optional<nlohmann::json> query_status(pid_t pid, const std::string& socket_path,
                                           std::string* error);

}  // namespace quanta::bpf
