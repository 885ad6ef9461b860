// Reads the node's settings files, then the QUANTA_* variables, once. Values that do not
// parse keep their default, variables an enforcing node does not honour are dropped, and
// each is reported once the options are published (logging reads the options itself).
#include "shim/base/options.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/policy.h"
#include "shim/base/settings_file.h"
#include "shim/base/spin.h"
#include "shim/base/text.h"

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

// Messages gathered while reading, written once the options are published. Fixed storage:
// values from a file live in a stack buffer that is gone by then.
constexpr int kMaxNotes = 8;
struct Notes {
  char text[kMaxNotes][320];
  int count = 0;
  void add(const char* format, ...) __attribute__((format(printf, 2, 3)));
};

void Notes::add(const char* format, ...) {
  if (count >= kMaxNotes) return;
  va_list args;
  va_start(args, format);
  vsnprintf(text[count++], sizeof text[0], format, args);
  va_end(args);
}

enum class Rule { kUnset, kOpen, kClosed, kClosedIfCapped };

struct FileSettings {
  bool node_found = false;
  bool enforce = true;  // the node config's default
  Rule node_rule = Rule::kUnset;
  char socket[108] = "";
  Rule container_rule = Rule::kUnset;
  bool capped = false;
  char pod[256] = "";
};

bool parse_rule(const char* text, bool allow_if_capped, Rule* rule) {
  if (!strcmp(text, "open"))
    *rule = Rule::kOpen;
  else if (!strcmp(text, "closed"))
    *rule = Rule::kClosed;
  else if (allow_if_capped && !strcmp(text, "closed-if-capped"))
    *rule = Rule::kClosedIfCapped;
  else
    return false;
  return true;
}

void report_read(const char* path, SettingsRead outcome, int bad_line, Notes* notes) {
  switch (outcome) {
    case SettingsRead::kAbsent:
    case SettingsRead::kRead:
      return;
    case SettingsRead::kUnreadable:
      notes->add("cannot read %s: its settings are not applied (an enforcing node's defaults are)",
                 path);
      return;
    case SettingsRead::kTooLong:
      notes->add("%s is longer than %zu bytes: ignored (an enforcing node's defaults apply)", path,
                 kSettingsFileMax);
      return;
    case SettingsRead::kMalformed:
      notes->add("%s line %d is not `key = value`: that line is ignored", path, bad_line);
      return;
  }
}

void read_node_file(FileSettings* files, Notes* notes) {
  int bad_line = 0;
  const SettingsRead outcome = read_settings_file(
      kNodeSettingsPath,
      [&](const SettingsLine& line) {
        if (!strcmp(line.key, "enforce")) {
          if (!strcmp(line.value, "on"))
            files->enforce = true;
          else if (!strcmp(line.value, "off"))
            files->enforce = false;
          else
            notes->add("%s line %d: enforce = \"%s\" is invalid: expected on or off (keeping on)",
                       kNodeSettingsPath, line.number, line.value);
        } else if (!strcmp(line.key, "unplaced")) {
          if (!parse_rule(line.value, true, &files->node_rule)) {
            files->node_rule = Rule::kClosed;
            notes->add(
                "%s line %d: unplaced = \"%s\" is invalid: expected open, closed or "
                "closed-if-capped (using closed)",
                kNodeSettingsPath, line.number, line.value);
          }
        } else if (!strcmp(line.key, "socket")) {
          if (line.value[0] != '/' || strlen(line.value) >= sizeof files->socket)
            notes->add(
                "%s line %d: socket = \"%s\" is invalid: expected an absolute path shorter "
                "than %zu bytes",
                kNodeSettingsPath, line.number, line.value, sizeof files->socket);
          else
            copy_text(files->socket, sizeof files->socket, line.value);
        } else {
          notes->add("%s line %d: unknown key \"%s\" (known: enforce, unplaced, socket)",
                     kNodeSettingsPath, line.number, line.key);
        }
      },
      &bad_line);
  files->node_found = outcome != SettingsRead::kAbsent;
  report_read(kNodeSettingsPath, outcome, bad_line, notes);
}

void read_container_file(FileSettings* files, Notes* notes) {
  int bad_line = 0;
  const SettingsRead outcome = read_settings_file(
      kContainerSettingsPath,
      [&](const SettingsLine& line) {
        if (!strcmp(line.key, "pod")) {
          copy_text(files->pod, sizeof files->pod, line.value);
        } else if (!strcmp(line.key, "memory_limit")) {
          if (!strcmp(line.value, "1"))
            files->capped = true;
          else if (!strcmp(line.value, "0"))
            files->capped = false;
          else {
            files->capped = true;
            notes->add("%s line %d: memory_limit = \"%s\" is invalid: expected 1 or 0 (taking 1)",
                       kContainerSettingsPath, line.number, line.value);
          }
        } else if (!strcmp(line.key, "unplaced")) {
          if (!parse_rule(line.value, false, &files->container_rule)) {
            files->container_rule = Rule::kClosed;
            notes->add(
                "%s line %d: unplaced = \"%s\" is invalid: expected open or closed (using "
                "closed)",
                kContainerSettingsPath, line.number, line.value);
          }
        } else {
          notes->add("%s line %d: unknown key \"%s\" (known: pod, memory_limit, unplaced)",
                     kContainerSettingsPath, line.number, line.key);
        }
      },
      &bad_line);
  report_read(kContainerSettingsPath, outcome, bad_line, notes);
  if (outcome == SettingsRead::kUnreadable || outcome == SettingsRead::kTooLong) {
    files->capped = true;  // unknown: the strict reading
  }
}

void apply_files(const FileSettings& files, Options* out) {
  out->enforced = files.node_found && files.enforce;
  if (files.socket[0]) copy_text(out->socket_path, sizeof out->socket_path, files.socket);
  copy_text(out->container_pod, sizeof out->container_pod, files.pod);
  // The container's rule is the hook's resolution of the node's for this container.
  Rule rule = files.container_rule != Rule::kUnset ? files.container_rule : files.node_rule;
  if (rule == Rule::kUnset) rule = files.node_found ? Rule::kClosedIfCapped : Rule::kOpen;
  out->unplaced_closed = rule == Rule::kClosed || (rule == Rule::kClosedIfCapped && files.capped);
}

// One QUANTA_* variable that would loosen a limit: honoured on nodes that do not enforce.
const char* loosening(const char* name, const Options& out, Notes* notes) {
  const char* value = getenv(name);
  if (!value || !*value) return nullptr;
  if (!out.enforced) return value;
  notes->add("ignoring %s=\"%.160s\": this node enforces its limits (%s)", name, value,
             kNodeSettingsPath);
  return nullptr;
}

void read_environment(Options* out, Notes* notes) {
  if (const char* v = getenv("QUANTA_LOG_LEVEL"); v && *v && !parse_level(v, &out->log_level))
    notes->add("ignoring QUANTA_LOG_LEVEL=\"%.160s\": expected error, warn, info or debug", v);
  if (const char* v = loosening("QUANTA_DISABLE", *out, notes); v && !parse_bool(v, &out->disabled))
    notes->add("ignoring QUANTA_DISABLE=\"%.160s\": expected 1 or 0", v);
  if (const char* v = loosening("QUANTA_COUNT_MANAGED", *out, notes)) {
    if (parse_bool(v, &out->count_managed))
      out->count_managed_set = true;
    else
      notes->add("ignoring QUANTA_COUNT_MANAGED=\"%.160s\": expected 1 or 0", v);
  }
  if (const char* v = loosening("QUANTA_CONTEXT_OVERHEAD", *out, notes)) {
    common::ParseError err;
    if (common::parse_bytes_or_zero(v, &out->context_overhead_bytes, &err))
      out->context_overhead_set = true;
    else
      notes->add("ignoring QUANTA_CONTEXT_OVERHEAD: %s", err.text);
  }
  if (const char* v = loosening("QUANTA_SOCKET", *out, notes))
    copy_text(out->socket_path, sizeof out->socket_path, v);
  if (const char* v = getenv("QUANTA_POD"); v && *v) copy_text(out->pod, sizeof out->pod, v);
}

const Options& read_once() noexcept {
  int expected = 0;
  if (g_state.compare_exchange_strong(expected, 1, std::memory_order_acquire)) {
    static Notes notes;  // static: a few KiB that a first CUDA call's stack need not hold
    FileSettings files;
    read_node_file(&files, &notes);
    read_container_file(&files, &notes);
    apply_files(files, &g_options);
    read_environment(&g_options, &notes);
    g_state.store(2, std::memory_order_release);
    for (int i = 0; i < notes.count; ++i) QUANTA_LOG_WARN("%s", notes.text[i]);
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

}  // namespace quanta::shim
