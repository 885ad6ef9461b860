// The node's settings files for the shim, mounted read-only into containers by quanta-hook:
// /etc/quanta/node.conf (node-wide) and /etc/quanta/container.conf (this container). Both
// are `key = value` lines with `#` comments; either may be absent (host processes). Read
// with open/read into a fixed buffer: no allocation, no locale, safe before the program's
// own initialisation has run.
#pragma once

#include <cstddef>

namespace quanta::shim {

// Fixed paths: a tenant must not be able to point the shim elsewhere, so nothing in the
// environment changes them. Tests place their own files there inside a private mount
// namespace (tests/shim/with_quanta_etc.cpp).
inline constexpr const char* kNodeSettingsPath = "/etc/quanta/node.conf";
inline constexpr const char* kContainerSettingsPath = "/etc/quanta/container.conf";

// Longest file read; longer files are refused as a whole (they are not what the hook writes).
inline constexpr size_t kSettingsFileMax = 4096;

// One `key = value` line, both trimmed and NUL-terminated inside the read buffer.
struct SettingsLine {
  const char* key;
  const char* value;
  int number;  // 1-based line number, for messages
};

enum class SettingsRead { kAbsent, kRead, kUnreadable, kTooLong, kMalformed };

// Calls visit(const SettingsLine&) for every setting in `path`, in order. kMalformed: some
// line was neither a setting, a comment nor blank; it is reported through `bad_line`
// (1-based) and the other lines are still visited.
template <typename Visit>
SettingsRead read_settings_file(const char* path, Visit&& visit, int* bad_line) noexcept;

// --- implementation -------------------------------------------------------------------

// Reads `path` into `buffer` (capacity kSettingsFileMax + 1). Returns the outcome and the
// length read.
SettingsRead load_settings_file(const char* path, char* buffer, size_t* length) noexcept;

// Splits one line in place; false when it is not `key = value`. Blank and comment lines
// give true with key == nullptr.
bool split_settings_line(char* line, SettingsLine* out) noexcept;

template <typename Visit>
SettingsRead read_settings_file(const char* path, Visit&& visit, int* bad_line) noexcept {
  char buffer[kSettingsFileMax + 1];
  size_t length = 0;
  const SettingsRead loaded = load_settings_file(path, buffer, &length);
  if (loaded != SettingsRead::kRead) return loaded;
  SettingsRead outcome = SettingsRead::kRead;
  int number = 0;
  for (size_t at = 0; at < length;) {
    size_t end = at;
    while (end < length && buffer[end] != '\n') ++end;
    buffer[end] = '\0';
    ++number;
    SettingsLine line{nullptr, nullptr, number};
    if (!split_settings_line(buffer + at, &line)) {
      if (outcome == SettingsRead::kRead && bad_line) *bad_line = number;
      outcome = SettingsRead::kMalformed;
    } else if (line.key) {
      visit(line);
    }
    at = end + 1;
  }
  return outcome;
}

}  // namespace quanta::shim
