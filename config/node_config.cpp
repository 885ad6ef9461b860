// Loading and validating the node config with toml++. Every value goes through the
// common/policy.h parsers so the config, annotations and quantactl accept the same forms;
// every error carries file:line:column, the key, the value and what is allowed.
#include "config/node_config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

#include "common/shm_layout.h"
#include "hosted/names.h"

namespace quanta::config {
namespace {

std::string where(const std::string& source, const toml::source_region& region) {
  return source + ":" + std::to_string(region.begin.line) + ":" +
         std::to_string(region.begin.column);
}

// The value as text for the policy parsers: strings as written, numbers printed plainly.
bool value_text(const toml::node& node, std::string* out) {
  if (auto s = node.as_string()) {
    *out = s->get();
    return true;
  }
  if (auto i = node.as_integer()) {
    *out = std::to_string(i->get());
    return true;
  }
  if (auto f = node.as_floating_point()) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.9g", f->get());
    *out = buf;
    return true;
  }
  return false;
}

std::string shown(const toml::node& node) {
  std::ostringstream os;
  if (auto s = node.as_string()) {
    os << '"' << hosted::printable(s->get()) << '"';
  } else if (node.is_table()) {
    os << "a table";
  } else if (node.is_array()) {
    os << "an array";
  } else if (auto b = node.as_boolean()) {
    os << (b->get() ? "true" : "false");
  } else {
    std::string text;
    if (value_text(node, &text)) os << text;
  }
  return os.str();
}

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const toml::node& node, const std::string& key,
                         const std::string& what) const {
    throw ConfigError(where(source_, node.source()) + ": " + key + " = " + shown(node) + ": " +
                      what);
  }

  void check_keys(const toml::table& table, const std::string& section,
                  std::initializer_list<const char*> allowed) const {
    for (auto&& [k, v] : table) {
      bool ok = false;
      for (const char* a : allowed) ok = ok || k.str() == a;
      if (ok) continue;
      std::string list;
      for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      throw ConfigError(where(source_, k.source()) + ": unknown key \"" +
                        hosted::printable(k.str()) + "\" in " + section + ": allowed keys are " +
                        list);
    }
  }

  std::string string_value(const toml::node& node, const std::string& key) const {
    auto s = node.as_string();
    if (s == nullptr || s->get().empty()) fail(node, key, "use a non-empty string");
    return s->get();
  }

  bool bool_value(const toml::node& node, const std::string& key) const {
    auto b = node.as_boolean();
    if (b == nullptr) fail(node, key, "use true or false");
    return b->get();
  }

  uint64_t duration_value(const toml::node& node, const std::string& key) const {
    std::string text;
    uint64_t ns = 0;
    common::ParseError err;
    if (!node.is_string() || !value_text(node, &text)) {
      fail(node, key, "use a string with a unit ns, us, ms or s (\"20ms\")");
    }
    if (!common::parse_duration(text, &ns, &err)) fail(node, key, err.text);
    return ns;
  }

  // A part of the quantum from "0%" to "50%" (or 0 to 0.5).
  uint32_t slack_value(const toml::node& node, const std::string& key) const {
    constexpr uint32_t kMaxPpm = common::kShareScale / 2;
    const char* allowed = "use a part of the quantum from \"0%\" to \"50%\" (\"10%\", 0.1)";
    std::string text;
    if (!value_text(node, &text)) fail(node, key, allowed);
    if (text == "0" || text == "0%" || text == "0.0") return 0;
    uint32_t ppm = 0;
    common::ParseError err;
    if (!common::parse_share(text, &ppm, &err))
      fail(node, key, std::string(err.text) + ": " + allowed);
    if (ppm > kMaxPpm) fail(node, key, "\"" + text + "\" is more than half a quantum: " + allowed);
    return ppm;
  }

  void policy_value(const toml::node& node, const std::string& section, std::string_view key,
                    common::Policy* policy) const {
    std::string full = section + "." + std::string(key);
    std::string text;
    if (!value_text(node, &text)) fail(node, full, "use a string or a number");
    std::string err = apply_policy_value(policy, std::string(key), text);
    if (!err.empty()) fail(node, full, err);
  }

  void policy_table(const toml::table& table, const std::string& section,
                    common::Policy* policy) const {
    check_keys(table, section,
               {"weight", "priority", "max_share", "min_share", "memory_limit", "quantum"});
    for (auto&& [k, v] : table) policy_value(v, section, k.str(), policy);
    std::string err = policy_error(*policy);
    if (!err.empty()) {
      const toml::node* at = table.get("min_share");
      if (at == nullptr) at = table.get("max_share");
      if (at == nullptr) throw ConfigError(source_ + ": [" + section + "]: " + err);
      fail(*at, section + (table.get("min_share") ? ".min_share" : ".max_share"), err);
    }
  }

  const toml::table& table_value(const toml::node& node, const std::string& key) const {
    auto t = node.as_table();
    if (t == nullptr) fail(node, key, "use a table ([" + key + "])");
    return *t;
  }

  // [bounds] or [namespace."NAME"]: what pods' annotations may ask for; unset keys keep
  // what `bounds` held (the built-in bounds, or [bounds] for a namespace).
  void bounds_table(const toml::table& table, const std::string& section,
                    PolicyBounds* bounds) const {
    check_keys(table, "[" + section + "]",
               {"max_weight", "priorities", "max_min_share", "namespace_min_share", "memory_limit",
                "max_memory_limit"});
    for (auto&& [k, v] : table) {
      const std::string key = section + "." + std::string(k.str());
      std::string text;
      common::ParseError err;
      if (k == "max_weight") {
        if (!value_text(v, &text) || !common::parse_weight(text, &bounds->max_weight, &err))
          fail(v, key, "use a whole number from 1 to 1000");
      } else if (k == "priorities") {
        const char* usage = "use a list of \"interactive\", \"batch\" and \"best-effort\"";
        auto arr = v.as_array();
        if (arr == nullptr) fail(v, key, usage);
        bounds->priorities = 0;
        for (auto&& e : *arr) {
          common::Priority p;
          if (!e.is_string() || !value_text(e, &text) || !common::parse_priority(text, &p, &err))
            fail(e, key, usage);
          bounds->priorities |= 1u << static_cast<uint32_t>(p);
        }
      } else if (k == "max_min_share" || k == "namespace_min_share") {
        uint32_t* out =
            k == "max_min_share" ? &bounds->max_min_share_ppm : &bounds->namespace_min_share_ppm;
        if (!value_text(v, &text)) fail(v, key, "use a share (\"50%\", 0.5) or 0");
        if (text == "0" || text == "0%" || text == "none") {
          *out = 0;
        } else if (!common::parse_share(text, out, &err)) {
          fail(v, key, std::string(err.text) + " (or 0 for none)");
        }
      } else if (k == "memory_limit") {
        text = string_value(v, key);
        if (text != "optional" && text != "required")
          fail(v, key, "use \"required\" (every pod gets a cap) or \"optional\"");
        bounds->memory_limit_required = text == "required";
      } else if (k == "max_memory_limit") {
        if (!value_text(v, &text)) fail(v, key, "use bytes with a suffix (\"40Gi\"), or \"none\"");
        if (text == "0" || text == "none") {
          bounds->max_memory_limit = 0;
        } else if (!common::parse_bytes(text, &bounds->max_memory_limit, &err)) {
          fail(v, key, std::string(err.text) + " (or \"none\")");
        }
      }
    }
  }

 private:
  std::string source_;
};

bool valid_scope(const std::string& s) {
  if (s.empty() || s.size() > 32) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

const char* unplaced_name(UnplacedAction a) {
  switch (a) {
    case UnplacedAction::kOpen:
      return "open";
    case UnplacedAction::kClosed:
      return "closed";
    case UnplacedAction::kClosedIfCapped:
      return "closed-if-capped";
  }
  return "?";
}

const char* over_cap_name(OverCapAction a) {
  switch (a) {
    case OverCapAction::kReport:
      return "report";
    case OverCapAction::kDeny:
      return "deny";
    case OverCapAction::kKill:
      return "kill";
  }
  return "?";
}

std::vector<FitProbe> MetricsConfig::default_fit_probes() {
  std::vector<FitProbe> probes(2);
  parse_fit_probe("0.25", "25%", &probes[0]);
  parse_fit_probe("0.1", "10%", &probes[1]);
  return probes;
}

common::Policy NodeConfig::policy_for(const std::string& pod) const {
  auto it = pods.find(pod);
  return it == pods.end() ? defaults : it->second;
}

const PolicyBounds& NodeConfig::bounds_for(std::string_view ns) const {
  auto it = namespace_bounds.find(ns);
  return it == namespace_bounds.end() ? bounds : it->second;
}

std::string apply_policy_value(common::Policy* policy, const std::string& annotated_key,
                               const std::string& value) {
  // quanta-hook may pass annotation names as they are ("quanta.dev/weight").
  constexpr std::string_view kAnnotationPrefix = "quanta.dev/";
  std::string key = annotated_key;
  if (key.rfind(kAnnotationPrefix, 0) == 0) key = key.substr(kAnnotationPrefix.size());
  common::ParseError err;
  bool ok = false;
  if (key == "weight") {
    ok = common::parse_weight(value, &policy->weight, &err);
  } else if (key == "priority") {
    ok = common::parse_priority(value, &policy->priority, &err);
  } else if (key == "max_share" || key == "max-share") {
    ok = common::parse_share(value, &policy->max_share_ppm, &err);
  } else if (key == "min_share" || key == "min-share") {
    if (value == "0" || value == "none") {
      policy->min_share_ppm = 0;
      return "";
    }
    ok = common::parse_share(value, &policy->min_share_ppm, &err);
  } else if (key == "memory_limit" || key == "memory-limit") {
    if (value == "0" || value == "none") {
      policy->memory_limit = 0;
      return "";
    }
    ok = common::parse_bytes(value, &policy->memory_limit, &err);
  } else if (key == "quantum") {
    ok = common::parse_duration(value, &policy->quantum_ns, &err);
  } else {
    return "unknown policy key \"" + key +
           "\": allowed keys are weight, priority, max-share, min-share, memory-limit, quantum";
  }
  return ok ? "" : std::string(err.text);
}

namespace {

std::string share_text(uint32_t ppm) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", ppm / static_cast<double>(common::kShareScale));
  return buf;
}

}  // namespace

std::string policy_error(const common::Policy& policy) {
  if (policy.min_share_ppm > policy.max_share_ppm) {
    return "min-share " + share_text(policy.min_share_ppm) + " is above max-share " +
           share_text(policy.max_share_ppm) +
           ": a pod cannot be promised more than its own ceiling (lower min-share or raise "
           "max-share)";
  }
  return "";
}

namespace {

std::string bytes_text(uint64_t bytes) {
  char buf[32];
  if (bytes % (1ull << 30) == 0) {
    std::snprintf(buf, sizeof(buf), "%lluGi", static_cast<unsigned long long>(bytes >> 30));
  } else if (bytes % (1ull << 20) == 0) {
    std::snprintf(buf, sizeof(buf), "%lluMi", static_cast<unsigned long long>(bytes >> 20));
  } else {
    std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(bytes));
  }
  return buf;
}

std::string priorities_text(uint32_t bits) {
  std::string out;
  for (common::Priority p :
       {common::Priority::kInteractive, common::Priority::kBatch, common::Priority::kBestEffort}) {
    if ((bits >> static_cast<uint32_t>(p)) & 1u)
      out += (out.empty() ? "" : ", ") + std::string(common::priority_name(p));
  }
  return out.empty() ? "none" : out;
}

}  // namespace

std::string bounds_error(const PolicyBounds& b, const std::string& where, const common::Policy& p,
                         const std::map<std::string, std::string>& asked) {
  // The annotation that asked (either spelling), or the node's default that applies.
  auto said = [&asked](const char* dashed, const char* underscored) -> std::string {
    auto it = asked.find(dashed);
    if (it == asked.end()) it = asked.find(underscored);
    if (it == asked.end()) return "";
    return "annotation quanta.dev/" + std::string(dashed) + " = \"" +
           hosted::printable(it->second) + "\"";
  };
  auto refused = [&](const char* dashed, const char* underscored, const std::string& allowed) {
    std::string what = said(dashed, underscored);
    if (what.empty())
      what = std::string("no quanta.dev/") + dashed + " annotation (the node's default)";
    return what + " is beyond the node's bounds: " + where + " allows " + allowed;
  };
  if (p.weight > b.max_weight)
    return refused("weight", "weight", "weight 1 to " + std::to_string(b.max_weight));
  if (!b.allows(p.priority))
    return refused("priority", "priority", "priority " + priorities_text(b.priorities));
  if (p.min_share_ppm > b.max_min_share_ppm)
    return refused("min-share", "min_share",
                   b.max_min_share_ppm == 0 ? std::string("no min-share")
                                            : "min-share up to " + share_text(b.max_min_share_ppm));
  if (p.min_share_ppm > b.namespace_min_share_ppm)
    return refused(
        "min-share", "min_share",
        "min-share up to " + share_text(b.namespace_min_share_ppm) + " per namespace and GPU");
  const std::string ceiling =
      b.max_memory_limit ? " up to " + bytes_text(b.max_memory_limit) : std::string();
  if ((b.memory_limit_required || b.max_memory_limit != 0) && p.memory_limit == 0)
    return refused("memory-limit", "memory_limit",
                   "no pod without a cap: every pod needs a memory-limit" + ceiling);
  if (b.max_memory_limit != 0 && p.memory_limit > b.max_memory_limit)
    return refused("memory-limit", "memory_limit", "memory-limit" + ceiling);
  return "";
}

namespace {

// Whether the space at text[at] follows a value of ten characters (underscores aside) that
// starts with a digit or a sign and has '-' fifth and eighth, and precedes one digit and
// then the value's end: never TOML, and the one shape toml++ 3.3 reads as "a date and a
// time" up to an end it assumes away. The value may start where the run of characters
// before the space starts, or after any '=', '[' or '{' in that run (the parser reads
// "a=1979-05-27" as a key and a value, "4464-08-=" as one value).
bool date_then_one_digit(std::string_view text, size_t at) {
  const auto ends_value = [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ',' || c == ']' || c == '}' ||
           c == '#';
  };
  if (at + 2 >= text.size() || text[at + 1] < '0' || text[at + 1] > '9') return false;
  if (!ends_value(text[at + 2])) return false;
  size_t counted = 0;  // characters back from the space, underscores aside
  bool dashes = true;  // the eighth and the fifth of ten are '-' (third and sixth counted back)
  for (size_t start = at; start > 0 && !ends_value(text[start - 1]);) {
    const char c = text[--start];
    if (c == '_') continue;
    ++counted;
    if ((counted == 3 || counted == 6) && c != '-') dashes = false;
    if (counted < 10) continue;
    const bool value_start = start == 0 || ends_value(text[start - 1]) || text[start - 1] == '=' ||
                             text[start - 1] == '[' || text[start - 1] == '{';
    return value_start && dashes && ((c >= '0' && c <= '9') || c == '+' || c == '-');
  }
  return false;
}

// What toml++ 3.3 would mishandle rather than refuse, found before it parses, as
// "LINE:COLUMN: problem" (1-based, columns in characters), or "". Each is a syntax error
// in TOML:
// - a table header whose name starts with a character no key may start with ("[=x]"),
//   which the parser assumes away (an assertion in debug builds, undefined behaviour under
//   clang in release ones);
// - a non-ASCII byte outside strings and comments;
// - a '}' or ']' that closes the other kind of bracket ("a = [1, }"): the parser asserts
//   that an array's next value does not start with '}';
// - a date, a space and one digit ("a = 1979-05-27 0"): the parser asserts that the digit
//   does not end the value.
// Lines inside strings and comments are text. Non-ASCII characters the parser meets inside
// tokens are its own errors: the build's copy of its headers (cmake/QuantaDeps.cmake)
// answers "not a space" for them.
std::string refused_before_parsing(std::string_view text) {
  static constexpr const char* kNotAKey =
      ": a table header names no table, or a key is not ASCII: use [name] or [pod.\"NAME\"], "
      "and keys of letters, digits, _ and - (other text only in quotes or comments)";
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // a UTF-8 byte-order mark
  enum class In { kNothing, kBasicMulti, kLiteralMulti };
  In in = In::kNothing;
  size_t line_no = 1;
  size_t line_begin = 0;  // where line_no begins in text
  bool line_start = true;
  struct Place {
    size_t line, line_begin, at;
  };
  const auto shown = [text](const Place& p) {
    size_t column = 1;
    for (size_t k = p.line_begin; k < p.at; ++k) column += (text[k] & 0xC0) != 0x80;
    return std::to_string(p.line) + ":" + std::to_string(column);
  };
  const auto place = [&](size_t at) { return shown(Place{line_no, line_begin, at}); };
  struct Open {
    char bracket;
    Place where;
  };
  std::vector<Open> open;  // the brackets not yet closed, innermost last
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line_no;
      line_begin = i + 1;
      line_start = true;
      continue;
    }
    if (in != In::kNothing) {  // inside a multi-line string: only its end matters
      const char* end = in == In::kBasicMulti ? "\"\"\"" : "'''";
      if (in == In::kBasicMulti && c == '\\') {
        if (++i < text.size() && text[i] == '\n') {  // a line-ending backslash
          ++line_no;
          line_begin = i + 1;
        }
      } else if (text.compare(i, 3, end) == 0) {
        in = In::kNothing;
        i += 2;
      }
      continue;
    }
    if (line_start && (c == ' ' || c == '\t')) continue;
    if (line_start && c == '[') {  // a table header: its name must start like a key
      size_t k = text.find_first_not_of(" \t", i + 1);
      if (k != std::string_view::npos && text[k] == '[') k = text.find_first_not_of(" \t", k + 1);
      if (k == std::string_view::npos) return place(i) + kNotAKey;
      const char n = text[k];
      const bool key_start = (n >= 'a' && n <= 'z') || (n >= 'A' && n <= 'Z') ||
                             (n >= '0' && n <= '9') || n == '_' || n == '-' || n == '"' ||
                             n == '\'' || n == ']';
      if (!key_start) return place(k) + kNotAKey;
    }
    line_start = false;
    if (c == '#') {  // a comment: skip to the end of the line
      const size_t nl = text.find('\n', i);
      if (nl == std::string_view::npos) break;
      i = nl - 1;
      continue;
    }
    // A quote opens a string where a key or a value may start; inside a bare token (12"ab")
    // the parser reads it as part of the token, and so does this scan.
    const bool token_start =
        i == 0 || std::string_view(" \t\r\n=[{,.").find(text[i - 1]) != std::string_view::npos;
    if (token_start && (c == '"' || c == '\'')) {
      if (text.compare(i, 3, c == '"' ? "\"\"\"" : "'''") == 0) {
        in = c == '"' ? In::kBasicMulti : In::kLiteralMulti;
        i += 2;
        continue;
      }
      // a one-line string: to its closing quote or the line's end
      for (++i; i < text.size() && text[i] != c && text[i] != '\n'; ++i) {
        if (c == '"' && text[i] == '\\' && i + 1 < text.size() && text[i + 1] != '\n') ++i;
      }
      if (i < text.size() && text[i] == '\n') --i;
      continue;
    }
    if (static_cast<unsigned char>(c) >= 0x80) return place(i) + kNotAKey;
    if (c == ' ' && date_then_one_digit(text, i)) {
      return place(i + 1) +
             ": a date is followed by a space and one digit: a time after a date is "
             "HH:MM:SS, as in 1979-05-27 07:32:00";
    }
    if (c == '[' || c == '{') {
      open.push_back({c, Place{line_no, line_begin, i}});
    } else if ((c == ']' || c == '}') && !open.empty()) {
      const Open o = open.back();
      open.pop_back();
      if (o.bracket != (c == ']' ? '[' : '{')) {
        return place(i) + ": '" + c + "' closes the '" + o.bracket + "' opened at " +
               shown(o.where) + ": an array ends with ']' and an inline table with '}'";
      }
    }
  }
  return "";
}

}  // namespace

namespace {

// [node]: where the sockets, regions and state live, which GPUs, how often NVML is read.
void read_node(Reader& r, const toml::node& n, NodeConfig* cfg) {
  const toml::table& node = r.table_value(n, "node");
  r.check_keys(node, "[node]",
               {"scope", "tenant_socket", "admin_socket", "state_dir", "allow_unregistered", "gpus",
                "nvml_interval", "nice"});
  for (auto&& [k, v] : node) {
    std::string key = "node." + std::string(k.str());
    if (k == "scope") {
      cfg->scope = r.string_value(v, key);
      if (!valid_scope(cfg->scope)) r.fail(v, key, "use 1 to 32 letters, digits, '-' or '_'");
    } else if (k == "tenant_socket") {
      cfg->tenant_socket = r.string_value(v, key);
    } else if (k == "admin_socket") {
      cfg->admin_socket = r.string_value(v, key);
    } else if (k == "state_dir") {
      cfg->state_dir = r.string_value(v, key);
    } else if (k == "allow_unregistered") {
      cfg->allow_unregistered = r.bool_value(v, key);
    } else if (k == "nvml_interval") {
      std::string text;
      if (value_text(v, &text) && text == "0") {
        cfg->nvml_interval_ns = 0;
      } else {
        cfg->nvml_interval_ns = r.duration_value(v, key);
        if (cfg->nvml_interval_ns < 100'000'000 || cfg->nvml_interval_ns > 60'000'000'000)
          r.fail(v, key,
                 "use a duration from 100ms to 60s, or 0 to never read NVML's process list");
      }
    } else if (k == "nice") {
      auto i = v.as_integer();
      if (i == nullptr || i->get() < -20 || i->get() > 19)
        r.fail(v, key, "use a whole number from -20 (first to run) to 19 (last), as nice(1) takes");
      cfg->nice = static_cast<int>(i->get());
    } else if (k == "gpus") {
      auto arr = v.as_array();
      if (arr == nullptr) r.fail(v, key, "use a list of GPU or MIG UUIDs ([\"GPU-…\"])");
      for (auto&& e : *arr) {
        auto s = e.as_string();
        if (s == nullptr || s->get().empty() || s->get().size() >= common::kUuidLen) {
          r.fail(e, key, "use UUID strings as NVML reports them (\"GPU-…\" or \"MIG-…\")");
        }
        cfg->gpus.push_back(s->get());
      }
    }
  }
}

// [scheduler]: the quantum and its bounds, revoke timeout, lease, idle release, slack.
void read_scheduler(Reader& r, const toml::node& n, NodeConfig* cfg) {
  const toml::table& sched = r.table_value(n, "scheduler");
  r.check_keys(sched, "[scheduler]",
               {"quantum", "quantum_min", "quantum_max", "revoke_timeout", "lease", "idle_release",
                "drain_overlap", "quantum_slack"});
  SchedulerConfig& s = cfg->scheduler;
  for (auto&& [k, v] : sched) {
    std::string key = "scheduler." + std::string(k.str());
    if (k == "drain_overlap") {
      s.drain_overlap = r.bool_value(v, key);
      continue;
    }
    if (k == "quantum_slack") {
      s.quantum_slack_ppm = r.slack_value(v, key);
      continue;
    }
    uint64_t ns = r.duration_value(v, key);
    if (k == "quantum") s.quantum_ns = ns;
    if (k == "quantum_min") s.quantum_min_ns = ns;
    if (k == "quantum_max") s.quantum_max_ns = ns;
    if (k == "revoke_timeout") s.revoke_timeout_ns = ns;
    if (k == "lease") s.lease_ns = ns;
    if (k == "idle_release") s.idle_release_ns = ns;
  }
  if (s.quantum_min_ns > s.quantum_max_ns || s.quantum_ns < s.quantum_min_ns ||
      s.quantum_ns > s.quantum_max_ns) {
    const toml::node* q = sched.get("quantum");
    r.fail(q != nullptr ? *q : n, "scheduler.quantum",
           "quantum_min <= quantum <= quantum_max is required (now " +
               std::to_string(s.quantum_min_ns) + "ns, " + std::to_string(s.quantum_ns) + "ns, " +
               std::to_string(s.quantum_max_ns) + "ns)");
  }
  if (s.lease_ns < 4'000'000) {
    r.fail(*sched.get("lease"), "scheduler.lease",
           "use at least 4ms (the heartbeat runs every lease/4)");
  }
}

// [enforce]: whether the arbiter's limits bind, what an unplaced process gets, and what
// NVML showing a pod above its cap does.
void read_enforce(Reader& r, const toml::node& n, NodeConfig* cfg) {
  const toml::table& t = r.table_value(n, "enforce");
  r.check_keys(t, "[enforce]", {"enforce", "unplaced", "over_cap"});
  for (auto&& [k, v] : t) {
    std::string key = "enforce." + std::string(k.str());
    if (k == "enforce") {
      cfg->enforce.enforce = r.bool_value(v, key);
    } else if (k == "unplaced") {
      std::string text = r.string_value(v, key);
      if (text == "open") {
        cfg->enforce.unplaced = UnplacedAction::kOpen;
      } else if (text == "closed") {
        cfg->enforce.unplaced = UnplacedAction::kClosed;
      } else if (text == "closed-if-capped") {
        cfg->enforce.unplaced = UnplacedAction::kClosedIfCapped;
      } else {
        r.fail(v, key, "use \"open\", \"closed\" or \"closed-if-capped\"");
      }
    } else if (k == "over_cap") {
      std::string text = r.string_value(v, key);
      if (text == "report") {
        cfg->enforce.over_cap = OverCapAction::kReport;
      } else if (text == "deny") {
        cfg->enforce.over_cap = OverCapAction::kDeny;
      } else if (text == "kill") {
        cfg->enforce.over_cap = OverCapAction::kKill;
      } else {
        r.fail(v, key, "use \"report\", \"deny\" or \"kill\"");
      }
    }
  }
}

// [shim]: what every shim charges per context, and whether managed memory counts.
void read_shim(Reader& r, const toml::node& n, NodeConfig* cfg) {
  const toml::table& t = r.table_value(n, "shim");
  r.check_keys(t, "[shim]", {"context_overhead", "count_managed"});
  for (auto&& [k, v] : t) {
    std::string key = "shim." + std::string(k.str());
    if (k == "count_managed") {
      cfg->shim.count_managed = r.bool_value(v, key);
    } else if (k == "context_overhead") {
      std::string text;
      common::ParseError err;
      if (!value_text(v, &text)) r.fail(v, key, "use \"measure\", a size (\"544Mi\") or 0");
      cfg->shim.measure_context_overhead = text == "measure";
      if (text == "measure") {
        cfg->shim.context_overhead = 0;
      } else if (!common::parse_bytes_or_zero(text, &cfg->shim.context_overhead, &err)) {
        r.fail(v, key, std::string(err.text) + ", or \"measure\"");
      }
    }
  }
}

// [hook]: how long quanta-hook waits for the arbiter.
void read_hook(Reader& r, const toml::node& n, NodeConfig* cfg) {
  const toml::table& t = r.table_value(n, "hook");
  r.check_keys(t, "[hook]", {"timeout"});
  if (auto v = t.get("timeout")) {
    cfg->hook.timeout_ns = r.duration_value(*v, "hook.timeout");
    if (cfg->hook.timeout_ns < 10'000'000 || cfg->hook.timeout_ns > 60'000'000'000ull)
      r.fail(*v, "hook.timeout", "use 10ms to 60s");
  }
}

// [metrics]: the Prometheus endpoint and the pod sizes its capacity metrics count.
void read_metrics(Reader& r, const toml::node& n, NodeConfig* cfg) {
  const toml::table& t = r.table_value(n, "metrics");
  r.check_keys(t, "[metrics]", {"listen", "fit_probes"});
  if (auto v = t.get("fit_probes")) {
    const char* usage = "use a list of {share = \"25%\", memory = \"10Gi\" or \"40%\"} tables";
    auto arr = v->as_array();
    if (arr == nullptr) r.fail(*v, "metrics.fit_probes", usage);
    cfg->metrics.fit_probes.clear();
    for (auto&& e : *arr) {
      auto probe = e.as_table();
      if (probe == nullptr) r.fail(e, "metrics.fit_probes", usage);
      r.check_keys(*probe, "a metrics.fit_probes entry", {"share", "memory"});
      const toml::node* share = probe->get("share");
      const toml::node* memory = probe->get("memory");
      std::string share_text, memory_text;
      if (share == nullptr || memory == nullptr || !value_text(*share, &share_text) ||
          !value_text(*memory, &memory_text)) {
        r.fail(e, "metrics.fit_probes", std::string("each entry needs share and memory: ") + usage);
      }
      FitProbe p;
      std::string err = parse_fit_probe(share_text, memory_text, &p);
      if (!err.empty()) r.fail(e, "metrics.fit_probes", err);
      for (const FitProbe& other : cfg->metrics.fit_probes) {
        if (other.share_label == p.share_label && other.memory_label == p.memory_label)
          r.fail(e, "metrics.fit_probes", "this probe is listed twice");
      }
      cfg->metrics.fit_probes.push_back(p);
    }
  }
  if (auto l = t.get("listen")) {
    cfg->metrics.listen = r.string_value(*l, "metrics.listen");
    const size_t colon = cfg->metrics.listen.rfind(':');
    const std::string port =
        colon == std::string::npos ? "" : cfg->metrics.listen.substr(colon + 1);
    bool digits = !port.empty() && port.size() <= 5 &&
                  port.find_first_not_of("0123456789") == std::string::npos;
    if (colon == 0 || !digits || std::stoul(port) > 65535)
      r.fail(*l, "metrics.listen", "use HOST:PORT (\"0.0.0.0:9400\", \"127.0.0.1:0\")");
  }
}

// [bounds] and [namespace."NAME"]: how far pods' annotations may go, node-wide and per
// namespace (a namespace's table starts from [bounds]).
void read_bounds(Reader& r, const toml::table& root, NodeConfig* cfg) {
  if (auto n = root.get("bounds"))
    r.bounds_table(r.table_value(*n, "bounds"), "bounds", &cfg->bounds);
  if (auto n = root.get("namespace")) {
    const toml::table& spaces = r.table_value(*n, "namespace");
    for (auto&& [k, v] : spaces) {
      const std::string name(k.str());
      const std::string section = "namespace.\"" + hosted::printable(name) + "\"";
      bool ok = !name.empty() && name.size() <= 63;
      for (unsigned char c : name)
        ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-');
      if (!ok) r.fail(v, section, "a namespace name is 1 to 63 lowercase letters, digits or '-'");
      PolicyBounds b = cfg->bounds;
      r.bounds_table(r.table_value(v, section), section, &b);
      cfg->namespace_bounds[name] = b;
    }
  }
}

// Every pod that asks for nothing gets [defaults]: each bounds table must allow them.
void check_defaults_within_bounds(const NodeConfig& cfg, const std::string& source_name) {
  auto check = [&](const PolicyBounds& b, const std::string& section) {
    std::string err;
    if (cfg.defaults.weight > b.max_weight)
      err = "weight " + std::to_string(cfg.defaults.weight);
    else if (!b.allows(cfg.defaults.priority))
      err = std::string("priority ") + common::priority_name(cfg.defaults.priority);
    else if (cfg.defaults.min_share_ppm > std::min(b.max_min_share_ppm, b.namespace_min_share_ppm))
      err = "min_share " + share_text(cfg.defaults.min_share_ppm);
    else if (b.max_memory_limit != 0 && cfg.defaults.memory_limit > b.max_memory_limit)
      err = "memory_limit above the ceiling";
    if (!err.empty())
      throw ConfigError(source_name + ": [defaults] " + err + " is beyond [" + section +
                        "]: every pod without that annotation would be refused; lower the default "
                        "or widen the bounds");
  };
  check(cfg.bounds, "bounds");
  for (const auto& [name, b] : cfg.namespace_bounds) check(b, "namespace.\"" + name + "\"");
}

// [pod."NAME"]: policies of pods named in the config, [defaults] applied first; their
// minimum shares must fit in one GPU together.
void read_pods(Reader& r, const toml::node& n, const std::string& source_name, NodeConfig* cfg) {
  const toml::table& pods = r.table_value(n, "pod");
  for (auto&& [k, v] : pods) {
    std::string name(k.str());
    std::string section = "pod.\"" + hosted::printable(name) + "\"";
    if (std::string err = hosted::check_pod_key(name, "the pod name"); !err.empty())
      r.fail(v, section, err);
    common::Policy p = cfg->defaults;
    r.policy_table(r.table_value(v, section), section, &p);
    cfg->pods[name] = p;
  }
  // The [pod] tables' processes may all use one GPU: their minimums must fit in it.
  uint64_t promised = 0;
  for (const auto& [name, p] : cfg->pods) promised += p.min_share_ppm;
  if (promised > common::kShareScale) {
    throw ConfigError(source_name + ": the [pod] tables promise min_share " +
                      share_text(static_cast<uint32_t>(std::min<uint64_t>(promised, UINT32_MAX))) +
                      " of a GPU in all: the minimums of pods that can share a GPU must add up "
                      "to at most 1");
  }
}

}  // namespace

NodeConfig parse_config(const std::string& text, const std::string& source_name) {
  if (const std::string refusal = refused_before_parsing(text); !refusal.empty()) {
    throw ConfigError(source_name + ":" + refusal);
  }
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    // toml++ quotes what it saw, newlines and control characters included: one line, escaped.
    throw ConfigError(where(source_name, e.source()) + ": " + hosted::printable(e.description()));
  }
  Reader r(source_name);
  NodeConfig cfg;
  cfg.source = source_name;
  r.check_keys(root, "the top level",
               {"node", "scheduler", "enforce", "shim", "hook", "metrics", "defaults", "pod",
                "bounds", "namespace"});

  if (auto n = root.get("node")) read_node(r, *n, &cfg);
  if (auto n = root.get("scheduler")) read_scheduler(r, *n, &cfg);
  if (auto n = root.get("enforce")) read_enforce(r, *n, &cfg);
  if (auto n = root.get("shim")) read_shim(r, *n, &cfg);
  if (auto n = root.get("hook")) read_hook(r, *n, &cfg);
  if (auto n = root.get("metrics")) read_metrics(r, *n, &cfg);
  if (auto n = root.get("defaults")) {
    r.policy_table(r.table_value(*n, "defaults"), "defaults", &cfg.defaults);
  }

  read_bounds(r, root, &cfg);
  check_defaults_within_bounds(cfg, source_name);
  if (auto n = root.get("pod")) read_pods(r, *n, source_name, &cfg);
  return cfg;
}

NodeConfig load_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot read the config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path);
}

}  // namespace quanta::config
