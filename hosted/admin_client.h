// The one client of the arbiter's admin socket (docs/quantactl-status.md) that quanta-hook,
// quantactl, quanta-trace and quanta-bench share: one request, one answer line, under one
// deadline for the whole exchange, because a caller that hangs blocks what waits on it
// (container creation, an operator's terminal, a tracing session).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace quanta::hosted {

enum class AdminOutcome {
  kAnswered,     // the arbiter answered ok
  kRefused,      // it answered with ok=false; `reason` is its error line
  kUnreachable,  // no socket, nobody listening, a broken or silent connection
};

struct AdminReply {
  AdminOutcome outcome = AdminOutcome::kUnreachable;
  nlohmann::json response;  // the answer (kAnswered, kRefused)
  std::string reason;       // why not kAnswered, one line
  // kUnreachable only: the errno of a connect the kernel refused (ENOENT, EACCES,
  // ECONNREFUSED...), 0 otherwise; and whether the deadline passed (a stopped or overloaded
  // arbiter), so a caller can say what to check.
  int connect_error = 0;
  bool timed_out = false;
};

// How long an answer may be. Requests a hook or a bench makes are answered in a few KiB;
// `status`, `top` and `explain` grow with the node (every tenant of every GPU), so the
// operator's tools take up to kStatusAnswerBytes.
constexpr size_t kSmallAnswerBytes = size_t{1} << 20;
constexpr size_t kStatusAnswerBytes = size_t{256} << 20;

// Sends `request` and waits for its answer line; never throws and never waits past
// `timeout_ns` in total (connecting included). `socket_path` may be any path connect(2)
// takes, /proc/self/fd/N of an O_PATH descriptor included. An answer longer than
// `max_answer_bytes` is refused (kUnreachable, naming the limit).
AdminReply admin_request(const std::string& socket_path, const nlohmann::json& request,
                         uint64_t timeout_ns, size_t max_answer_bytes = kSmallAnswerBytes);

}  // namespace quanta::hosted
