// Loading and splitting the shim's settings files. System calls only (open, read, close),
// so it runs before anything in the process is initialised.
#include "shim/base/settings_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace quanta::shim {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r';
}

char* trim(char* begin, char* end) {
  while (begin < end && is_space(*begin)) ++begin;
  while (end > begin && is_space(end[-1])) --end;
  *end = '\0';
  return begin;
}

}  // namespace

SettingsRead load_settings_file(const char* path, char* buffer, size_t* length) noexcept {
  *length = 0;
  int fd;
  do {
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0)
    return errno == ENOENT || errno == ENOTDIR ? SettingsRead::kAbsent : SettingsRead::kUnreadable;
  size_t used = 0;
  SettingsRead outcome = SettingsRead::kRead;
  for (;;) {
    const ssize_t got = read(fd, buffer + used, kSettingsFileMax + 1 - used);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      outcome = SettingsRead::kUnreadable;
      break;
    }
    if (got == 0) break;
    used += static_cast<size_t>(got);
    if (used > kSettingsFileMax) {
      outcome = SettingsRead::kTooLong;
      break;
    }
  }
  close(fd);
  if (outcome != SettingsRead::kRead) return outcome;
  buffer[used] = '\0';
  *length = used;
  return SettingsRead::kRead;
}

bool split_settings_line(char* line, SettingsLine* out) noexcept {
  char* end = line;
  while (*end && *end != '#') ++end;
  char* text = trim(line, end);
  out->key = nullptr;
  out->value = nullptr;
  if (*text == '\0') return true;  // blank or comment
  char* equals = text;
  while (*equals && *equals != '=') ++equals;
  if (*equals != '=') return false;
  char* value_end = equals + 1;
  while (*value_end) ++value_end;
  char* key = trim(text, equals);
  char* value = trim(equals + 1, value_end);
  if (*key == '\0') return false;
  for (const char* p = key; *p; ++p) {
    const bool ok = (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_';
    if (!ok) return false;
  }
  out->key = key;
  out->value = value;
  return true;
}

}  // namespace quanta::shim
