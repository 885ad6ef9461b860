// The shim's own logger: allocation-free, one line per message on stderr with a
// `quanta:` prefix, level from QUANTA_LOG_LEVEL (error|warn|info|debug, default warn).
// spdlog needs libstdc++, which the freestanding shim must not; the daemons use spdlog.
#pragma once

namespace quanta::shim {

enum class LogLevel : int { error = 0, warn = 1, info = 2, debug = 3 };

// True when messages of `level` are written. Reads the cached option: one atomic load.
bool log_enabled(LogLevel level) noexcept;

// Formats into a fixed stack buffer (longer lines are cut) and writes it with write(2).
void log_write(LogLevel level, const char* format, ...) noexcept
    __attribute__((format(printf, 2, 3)));

}  // namespace quanta::shim

#define QUANTA_LOG(level, ...)                                                             \
  do {                                                                                     \
    if (::quanta::shim::log_enabled(level)) ::quanta::shim::log_write(level, __VA_ARGS__); \
  } while (0)
#define QUANTA_LOG_ERROR(...) QUANTA_LOG(::quanta::shim::LogLevel::error, __VA_ARGS__)
#define QUANTA_LOG_WARN(...) QUANTA_LOG(::quanta::shim::LogLevel::warn, __VA_ARGS__)
#define QUANTA_LOG_INFO(...) QUANTA_LOG(::quanta::shim::LogLevel::info, __VA_ARGS__)
#define QUANTA_LOG_DEBUG(...) QUANTA_LOG(::quanta::shim::LogLevel::debug, __VA_ARGS__)
