// The shim's logger: formats with vsnprintf into a stack buffer and writes one line to
// stderr with a single write(2), so concurrent lines do not interleave mid-line.
#include "shim/base/log.h"

#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>

#include "shim/base/options.h"

namespace quanta::shim {

namespace {

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::error:
      return "error";
    case LogLevel::warn:
      return "warn";
    case LogLevel::info:
      return "info";
    case LogLevel::debug:
      return "debug";
  }
  return "?";
}

}  // namespace

bool log_enabled(LogLevel level) noexcept {
  return static_cast<int>(level) <= static_cast<int>(options().log_level);
}

void log_write(LogLevel level, const char* format, ...) noexcept {
  const int saved_errno = errno;  // logging must never change what the caller sees
  char line[512];
  int used = snprintf(line, sizeof line, "quanta: [%d] %s: ", static_cast<int>(getpid()),
                      level_name(level));
  if (used < 0) used = 0;
  va_list args;
  va_start(args, format);
  const int wanted = vsnprintf(line + used, sizeof line - static_cast<size_t>(used), format, args);
  va_end(args);
  size_t length = static_cast<size_t>(used) + (wanted > 0 ? static_cast<size_t>(wanted) : 0);
  if (length > sizeof line - 2) length = sizeof line - 2;  // cut long lines, keep the newline
  line[length++] = '\n';
  ssize_t ignored = write(STDERR_FILENO, line, length);
  (void)ignored;
  errno = saved_errno;
}

}  // namespace quanta::shim
