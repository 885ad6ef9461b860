// config.json reading with nlohmann-json: a malformed bundle is a HookError naming the
// field, never a crash (fuzzed by tests/fuzz/bundle_config_fuzz.cpp).
#include "hooks/bundle.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hooks/error.h"
#include "hooks/json_fields.h"

namespace quanta::hooks {
namespace {

using nlohmann::json;

constexpr size_t kMaxConfigBytes = 16 << 20;
const std::string kWhat = "the bundle's config.json";

const json* member(const json& j, const char* key, json::value_t type, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  if (it->type() != type) {
    const char* expected = type == json::value_t::object ? "an object" : "an array";
    throw HookError(kWhat + "'s " + where + key + " is not " + expected);
  }
  return &*it;
}

int64_t number(const json& j, const char* key, const std::string& where, int64_t absent) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absent;
  if (!it->is_number_integer())
    throw HookError(kWhat + "'s " + where + key + " is " + shown(it->dump()) +
                    ": expected a whole number");
  return it->get<int64_t>();
}

char type_letter(const json& j, const std::string& where, const std::string& allowed) {
  std::string t = optional_string(j, "type", kWhat + "'s " + where);
  if (t.empty()) return allowed[0];
  if (t.size() != 1 || allowed.find(t[0]) == std::string::npos)
    throw HookError(kWhat + "'s " + where + "type is " + shown(t) + ": expected one of " +
                    allowed);
  return t[0];
}

}  // namespace

BundleConfig parse_bundle_config(std::string_view text, const std::string& bundle) {
  json j = parse_json_object(text, kWhat);
  BundleConfig c;

  const json* root = member(j, "root", json::value_t::object, "");
  if (root == nullptr) throw HookError(kWhat + " has no root (the container's rootfs)");
  std::string path = required_string(*root, "path", kWhat + "'s root");
  c.root_path = path[0] == '/' ? path : bundle + "/" + path;
  if (auto ro = root->find("readonly"); ro != root->end() && ro->is_boolean())
    c.root_readonly = ro->get<bool>();

  c.annotations = string_map(j, "annotations", kWhat);

  if (const json* process = member(j, "process", json::value_t::object, "")) {
    if (const json* env = member(*process, "env", json::value_t::array, "process.")) {
      for (const json& e : *env) {
        if (!e.is_string()) throw HookError(kWhat + "'s process.env holds a non-string entry");
        const std::string& text = e.get_ref<const std::string&>();
        const size_t eq = text.find('=');
        if (eq == std::string::npos || eq == 0) continue;  // runtimes pass such entries through
        c.env[text.substr(0, eq)] = text.substr(eq + 1);
      }
    }
  }

  if (const json* mounts = member(j, "mounts", json::value_t::array, "")) {
    for (const json& m : *mounts) {
      if (!m.is_object()) throw HookError(kWhat + "'s mounts holds a non-object entry");
      c.mount_destinations.push_back(required_string(m, "destination", kWhat + "'s mount"));
    }
  }

  if (const json* linux = member(j, "linux", json::value_t::object, "")) {
    if (const json* devices = member(*linux, "devices", json::value_t::array, "linux.")) {
      for (const json& d : *devices) {
        if (!d.is_object()) throw HookError(kWhat + "'s linux.devices holds a non-object entry");
        DeviceNode n;
        n.path = required_string(d, "path", kWhat + "'s linux.devices entry");
        n.type = type_letter(d, "linux.devices entry ", "cbup");
        n.major = number(d, "major", "linux.devices entry ", -1);
        n.minor = number(d, "minor", "linux.devices entry ", -1);
        c.devices.push_back(n);
      }
    }
    if (const json* resources = member(*linux, "resources", json::value_t::object, "linux.")) {
      if (const json* rules =
              member(*resources, "devices", json::value_t::array, "linux.resources.")) {
        for (const json& r : *rules) {
          if (!r.is_object())
            throw HookError(kWhat + "'s linux.resources.devices holds a non-object entry");
          DeviceRule rule;
          auto allow = r.find("allow");
          if (allow == r.end() || !allow->is_boolean())
            throw HookError(kWhat + "'s linux.resources.devices entry has no allow boolean");
          rule.allow = allow->get<bool>();
          rule.type = type_letter(r, "linux.resources.devices entry ", "acb");
          rule.major = number(r, "major", "linux.resources.devices entry ", -1);
          rule.minor = number(r, "minor", "linux.resources.devices entry ", -1);
          rule.access = optional_string(r, "access", kWhat + "'s linux.resources.devices entry");
          c.device_rules.push_back(rule);
        }
      }
    }
  }
  return c;
}

BundleConfig read_bundle_config(const std::string& bundle) {
  const std::string path = bundle + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw HookError("cannot read " + path + " (the container's bundle)");
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxConfigBytes) throw HookError(path + " is longer than 16 MiB");
  }
  return parse_bundle_config(text, bundle);
}

}  // namespace quanta::hooks
