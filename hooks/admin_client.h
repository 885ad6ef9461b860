// The hook's side of the arbiter's admin socket (docs/quantactl-status.md): one request,
// one answer, under a deadline, because a hook that hangs blocks container creation.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace quanta::hooks {

enum class AdminOutcome {
  kAnswered,     // the arbiter answered ok
  kRefused,      // it answered with ok=false; `reason` is its error line
  kUnreachable,  // no socket, nobody listening, a broken or silent connection
};

struct AdminReply {
  AdminOutcome outcome = AdminOutcome::kUnreachable;
  nlohmann::json response;
  std::string reason;
};

// Sends `request` and waits for its answer line; never throws and never waits past
// `timeout_ns` in total (connecting included).
AdminReply admin_request(const std::string& socket_path, const nlohmann::json& request,
                         uint64_t timeout_ns);

}  // namespace quanta::hooks
