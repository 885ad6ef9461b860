// Reads QUANTA_* variables once. Values that do not parse keep their default and are
// reported once the options are published (logging reads the options itself).
#include "shim/options.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "shim/spin.h"

namespace quanta::shim {

namespace {

Options g_options;
std::atomic<int> g_state{0};  // 0 unread, 1 being read, 2 ready

bool parse_bool(const char* text, bool* value) {
  if (!strcmp(text, "1") || !strcmp(text, "true") || !strcmp(text, "on") || !strcmp(text, "yes")) {
    *value = true;
    return true;
  }
  if (!strcmp(text, "0") || !strcmp(text, "false") || !strcmp(text, "off") || !strcmp(text, "no")) {
    *value = false;
    return true;
  }
  return false;
}

bool parse_level(const char* text, LogLevel* level) {
  static constexpr struct {
    const char* name;
    LogLevel level;
  } kLevels[] = {{"error", LogLevel::error},
                 {"warn", LogLevel::warn},
                 {"info", LogLevel::info},
                 {"debug", LogLevel::debug}};
  for (const auto& entry : kLevels) {
    if (!strcmp(text, entry.name)) {
      *level = entry.level;
      return true;
    }
  }
  return false;
}

void copy_bounded(char* out, size_t capacity, const char* text) {
  size_t length = strlen(text);
  if (length >= capacity) length = capacity - 1;
  memcpy(out, text, length);
  out[length] = '\0';
}

struct Rejected {
  const char* name = nullptr;
  const char* value = nullptr;
  const char* allowed = nullptr;
};

void read_environment(Options* out, Rejected (&rejected)[4]) {
  int rejects = 0;
  auto reject = [&](const char* name, const char* value, const char* allowed) {
    if (rejects < 4) rejected[rejects++] = {name, value, allowed};
  };
  if (const char* v = getenv("QUANTA_LOG_LEVEL"); v && *v && !parse_level(v, &out->log_level))
    reject("QUANTA_LOG_LEVEL", v, "error, warn, info or debug");
  if (const char* v = getenv("QUANTA_DISABLE"); v && *v && !parse_bool(v, &out->disabled))
    reject("QUANTA_DISABLE", v, "1 or 0");
  if (const char* v = getenv("QUANTA_COUNT_MANAGED");
      v && *v && !parse_bool(v, &out->count_managed))
    reject("QUANTA_COUNT_MANAGED", v, "1 or 0");
  if (const char* v = getenv("QUANTA_CONTEXT_OVERHEAD");
      v && *v && !parse_byte_size(v, &out->context_overhead_bytes))
    reject("QUANTA_CONTEXT_OVERHEAD", v, "bytes, optionally with Ki, Mi, Gi or Ti");
  if (const char* v = getenv("QUANTA_SOCKET"); v && *v)
    copy_bounded(out->socket_path, sizeof out->socket_path, v);
  if (const char* v = getenv("QUANTA_POD"); v && *v) copy_bounded(out->pod, sizeof out->pod, v);
}

const Options& read_once() noexcept {
  int expected = 0;
  if (g_state.compare_exchange_strong(expected, 1, std::memory_order_acquire)) {
    Rejected rejected[4];
    read_environment(&g_options, rejected);
    g_state.store(2, std::memory_order_release);
    for (const Rejected& r : rejected) {
      if (r.name) QUANTA_LOG_WARN("ignoring %s=\"%s\": expected %s", r.name, r.value, r.allowed);
    }
    return g_options;
  }
  while (g_state.load(std::memory_order_acquire) != 2) cpu_relax();
  return g_options;
}

}  // namespace

const Options& options() noexcept {
  if (__builtin_expect(g_state.load(std::memory_order_acquire) == 2, 1)) return g_options;
  return read_once();
}

bool parse_byte_size(const char* text, uint64_t* bytes) noexcept {
  if (!text || *text < '0' || *text > '9') return false;
  uint64_t value = 0;
  const char* p = text;
  for (; *p >= '0' && *p <= '9'; ++p) {
    const uint64_t digit = static_cast<uint64_t>(*p - '0');
    if (value > (UINT64_MAX - digit) / 10) return false;
    value = value * 10 + digit;
  }
  unsigned shift = 0;
  if (!strcmp(p, ""))
    shift = 0;
  else if (!strcmp(p, "Ki"))
    shift = 10;
  else if (!strcmp(p, "Mi"))
    shift = 20;
  else if (!strcmp(p, "Gi"))
    shift = 30;
  else if (!strcmp(p, "Ti"))
    shift = 40;
  else
    return false;
  if (shift && value > (UINT64_MAX >> shift)) return false;
  *bytes = value << shift;
  return true;
}

}  // namespace quanta::shim
