// Loading and validating the node config with toml++. Every value goes through the
// common/policy.h parsers so the config, annotations and quantactl accept the same forms;
// every error carries file:line:column, the key, the value and what is allowed.
#include "arbiter/config.h"

#include <toml++/toml.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/shm_layout.h"

namespace quanta::arbiter {
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
    os << '"' << s->get() << '"';
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
      throw ConfigError(where(source_, k.source()) + ": unknown key \"" + std::string(k.str()) +
                        "\" in " + section + ": allowed keys are " + list);
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
    check_keys(table, section, {"weight", "priority", "max_share", "memory_limit", "quantum"});
    for (auto&& [k, v] : table) policy_value(v, section, k.str(), policy);
  }

  const toml::table& table_value(const toml::node& node, const std::string& key) const {
    auto t = node.as_table();
    if (t == nullptr) fail(node, key, "use a table ([" + key + "])");
    return *t;
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
    case UnplacedAction::kOpen: return "open";
    case UnplacedAction::kClosed: return "closed";
    case UnplacedAction::kClosedIfCapped: return "closed-if-capped";
  }
  return "?";
}

const char* over_cap_name(OverCapAction a) {
  switch (a) {
    case OverCapAction::kReport: return "report";
    case OverCapAction::kDeny: return "deny";
    case OverCapAction::kKill: return "kill";
  }
  return "?";
}

common::Policy NodeConfig::policy_for(const std::string& pod) const {
  auto it = pods.find(pod);
  return it == pods.end() ? defaults : it->second;
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
           "\": allowed keys are weight, priority, max-share, memory-limit, quantum";
  }
  return ok ? "" : std::string(err.text);
}

NodeConfig parse_config(const std::string& text, const std::string& source_name) {
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    throw ConfigError(where(source_name, e.source()) + ": " + std::string(e.description()));
  }
  Reader r(source_name);
  NodeConfig cfg;
  cfg.source = source_name;
  r.check_keys(root, "the top level",
               {"node", "scheduler", "enforce", "shim", "metrics", "defaults", "pod"});

  if (auto n = root.get("node")) {
    const toml::table& node = r.table_value(*n, "node");
    r.check_keys(
        node, "[node]",
        {"scope", "tenant_socket", "admin_socket", "state_dir", "allow_unregistered", "gpus"});
    for (auto&& [k, v] : node) {
      std::string key = "node." + std::string(k.str());
      if (k == "scope") {
        cfg.scope = r.string_value(v, key);
        if (!valid_scope(cfg.scope)) r.fail(v, key, "use 1 to 32 letters, digits, '-' or '_'");
      } else if (k == "tenant_socket") {
        cfg.tenant_socket = r.string_value(v, key);
      } else if (k == "admin_socket") {
        cfg.admin_socket = r.string_value(v, key);
      } else if (k == "state_dir") {
        cfg.state_dir = r.string_value(v, key);
      } else if (k == "allow_unregistered") {
        cfg.allow_unregistered = r.bool_value(v, key);
      } else if (k == "gpus") {
        auto arr = v.as_array();
        if (arr == nullptr) r.fail(v, key, "use a list of GPU or MIG UUIDs ([\"GPU-…\"])");
        for (auto&& e : *arr) {
          auto s = e.as_string();
          if (s == nullptr || s->get().empty() || s->get().size() >= common::kUuidLen) {
            r.fail(e, key, "use UUID strings as NVML reports them (\"GPU-…\" or \"MIG-…\")");
          }
          cfg.gpus.push_back(s->get());
        }
      }
    }
  }

  if (auto n = root.get("scheduler")) {
    const toml::table& sched = r.table_value(*n, "scheduler");
    r.check_keys(sched, "[scheduler]",
                 {"quantum", "quantum_min", "quantum_max", "revoke_timeout", "lease",
                  "idle_release", "drain_overlap"});
    SchedulerConfig& s = cfg.scheduler;
    for (auto&& [k, v] : sched) {
      std::string key = "scheduler." + std::string(k.str());
      if (k == "drain_overlap") {
        s.drain_overlap = r.bool_value(v, key);
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
      r.fail(q != nullptr ? *q : *n, "scheduler.quantum",
             "quantum_min <= quantum <= quantum_max is required (now " +
                 std::to_string(s.quantum_min_ns) + "ns, " + std::to_string(s.quantum_ns) + "ns, " +
                 std::to_string(s.quantum_max_ns) + "ns)");
    }
    if (s.lease_ns < 4'000'000) {
      r.fail(*sched.get("lease"), "scheduler.lease",
             "use at least 4ms (the heartbeat runs every lease/4)");
    }
  }

  if (auto n = root.get("enforce")) {
    const toml::table& t = r.table_value(*n, "enforce");
    r.check_keys(t, "[enforce]", {"enforce", "unplaced", "over_cap"});
    for (auto&& [k, v] : t) {
      std::string key = "enforce." + std::string(k.str());
      if (k == "enforce") {
        cfg.enforce.enforce = r.bool_value(v, key);
      } else if (k == "unplaced") {
        std::string text = r.string_value(v, key);
        if (text == "open") {
          cfg.enforce.unplaced = UnplacedAction::kOpen;
        } else if (text == "closed") {
          cfg.enforce.unplaced = UnplacedAction::kClosed;
        } else if (text == "closed-if-capped") {
          cfg.enforce.unplaced = UnplacedAction::kClosedIfCapped;
        } else {
          r.fail(v, key, "use \"open\", \"closed\" or \"closed-if-capped\"");
        }
      } else if (k == "over_cap") {
        std::string text = r.string_value(v, key);
        if (text == "report") {
          cfg.enforce.over_cap = OverCapAction::kReport;
        } else if (text == "deny") {
          cfg.enforce.over_cap = OverCapAction::kDeny;
        } else if (text == "kill") {
          cfg.enforce.over_cap = OverCapAction::kKill;
        } else {
          r.fail(v, key, "use \"report\", \"deny\" or \"kill\"");
        }
      }
    }
  }

  if (auto n = root.get("shim")) {
    const toml::table& t = r.table_value(*n, "shim");
    r.check_keys(t, "[shim]", {"context_overhead", "count_managed"});
    for (auto&& [k, v] : t) {
      std::string key = "shim." + std::string(k.str());
      if (k == "count_managed") {
        cfg.shim.count_managed = r.bool_value(v, key);
      } else if (k == "context_overhead") {
        std::string text;
        common::ParseError err;
        if (!value_text(v, &text)) r.fail(v, key, "use a size (\"300Mi\") or 0");
        if (text == "0") {
          cfg.shim.context_overhead = 0;
        } else if (!common::parse_bytes(text, &cfg.shim.context_overhead, &err)) {
          r.fail(v, key, err.text);
        }
      }
    }
  }

  if (auto n = root.get("metrics")) {
    const toml::table& t = r.table_value(*n, "metrics");
    r.check_keys(t, "[metrics]", {"listen"});
    if (auto l = t.get("listen")) {
      cfg.metrics.listen = r.string_value(*l, "metrics.listen");
      const size_t colon = cfg.metrics.listen.rfind(':');
      const std::string port = colon == std::string::npos ? "" : cfg.metrics.listen.substr(colon + 1);
      bool digits = !port.empty() && port.size() <= 5 &&
                    port.find_first_not_of("0123456789") == std::string::npos;
      if (colon == 0 || !digits || std::stoul(port) > 65535)
        r.fail(*l, "metrics.listen", "use HOST:PORT (\"0.0.0.0:9400\", \"127.0.0.1:0\")");
    }
  }

  if (auto n = root.get("defaults")) {
    r.policy_table(r.table_value(*n, "defaults"), "defaults", &cfg.defaults);
  }

  if (auto n = root.get("pod")) {
    const toml::table& pods = r.table_value(*n, "pod");
    for (auto&& [k, v] : pods) {
      std::string name(k.str());
      std::string section = "pod.\"" + name + "\"";
      if (name.empty() || name.size() >= common::kPodKeyLen) {
        r.fail(v, section,
               "use a pod name of 1 to " + std::to_string(common::kPodKeyLen - 1) + " bytes");
      }
      common::Policy p = cfg.defaults;
      r.policy_table(r.table_value(v, section), section, &p);
      cfg.pods[name] = p;
    }
  }
  return cfg;
}

NodeConfig load_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot read the config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path);
}

}  // namespace quanta::arbiter
