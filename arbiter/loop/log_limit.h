// Rate limits for log lines a tenant can trigger (refusals, dropped connections, exits):
// a burst per kind, then one line per interval saying how many were left out, so a
// hostile tenant cannot fill the disk or bury the lines an operator needs.
#pragma once

#include <spdlog/spdlog.h>

#include <cstdint>
#include <map>
#include <string>

namespace quanta::arbiter {

class LogLimiter {
 public:
  // Up to `burst` lines of one kind per `interval_ns`.
  LogLimiter(uint32_t burst, uint64_t interval_ns) : burst_(burst), interval_ns_(interval_ns) {}

  // True when a line of `kind` may be written now. When lines were left out since the
  // last one, `*suppressed` says how many (0 otherwise).
  bool allow(const std::string& kind, uint64_t now_ns, uint64_t* suppressed);

  template <typename... Args>
  void log(spdlog::level::level_enum level, const std::string& kind, uint64_t now_ns,
           spdlog::format_string_t<Args...> fmt, Args&&... args) {
    uint64_t suppressed = 0;
    if (!allow(kind, now_ns, &suppressed)) return;
    if (suppressed != 0) spdlog::log(level, "({} similar \"{}\" lines left out)", suppressed, kind);
    spdlog::log(level, fmt, std::forward<Args>(args)...);
  }

 private:
  struct Bucket {
    uint64_t window_start = 0;
    uint32_t used = 0;
    uint64_t suppressed = 0;
  };
  uint32_t burst_;
  uint64_t interval_ns_;
  std::map<std::string, Bucket> buckets_;  // a fixed handful of kinds, named in the code
};

}  // namespace quanta::arbiter
