// Parsing admin requests with nlohmann-json, without exceptions escaping.
#include "arbiter/serving/admin_protocol.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "hosted/names.h"

namespace quanta::arbiter {
namespace {

using nlohmann::json;

constexpr size_t kMaxField = 4096;

// Policy values may come as strings or numbers; the parsers take text.
bool policy_text(const json& v, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
  } else if (v.is_number_integer()) {
    *out = v.is_number_unsigned() ? std::to_string(v.get<uint64_t>())
                                  : std::to_string(v.get<int64_t>());
  } else if (v.is_number()) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.9g", v.get<double>());
    *out = buf;
  } else {
    return false;
  }
  return true;
}

std::string policy_map(const json& j, const char* field, std::map<std::string, std::string>* out) {
  if (j.is_null()) return "";
  if (!j.is_object()) return std::string(field) + " must be an object of key: value";
  for (const auto& [k, v] : j.items()) {
    std::string err = hosted::check_text(k, std::string(field) + " key", 64);
    if (!err.empty()) return err;
    std::string text;
    if (!policy_text(v, &text))
      return std::string(field) + " value of " + hosted::printable(k) +
             " must be a string or a number";
    err = hosted::check_text(text, std::string(field) + " value of " + hosted::printable(k), 256);
    if (!err.empty()) return err;
    (*out)[k] = text;
  }
  return "";
}

// A string field: absent is "", anything but a string is an error.
std::string text_field(const json& request, const char* name, std::string* out) {
  if (!request.contains(name) || request.at(name).is_null()) return "";
  const json& v = request.at(name);
  if (!v.is_string()) return std::string(name) + " must be a string";
  *out = v.get<std::string>();
  return hosted::check_text(*out, name, kMaxField);
}

}  // namespace

std::string parse_admin_request(std::string_view line, AdminRequest* out) {
  json request = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded()) return "request is not valid JSON";
  if (!request.is_object() || !request.contains("cmd") || !request["cmd"].is_string())
    return "a request is an object with \"cmd\": status, top, explain, set, unset, policy, register, unregister, drain, undrain or devices";
  const std::string cmd = request["cmd"].get<std::string>();
  std::string err;
  if (cmd == "status") {
    out->command = AdminRequest::Command::kStatus;
    return "";
  }
  if (cmd == "devices") {
    out->command = AdminRequest::Command::kDevices;
    return "";
  }
  if (cmd == "top") {
    out->command = AdminRequest::Command::kTop;
    return "";
  }
  if (cmd == "explain") {
    out->command = AdminRequest::Command::kExplain;
    if (!(err = text_field(request, "pod", &out->pod)).empty()) return err;
    if (out->pod.empty()) return "explain needs \"pod\": the pod's key (namespace/name) or name";
    if (request.contains("seconds") && !request["seconds"].is_null()) {
      const json& v = request["seconds"];
      if (!v.is_number() || !(v.get<double>() >= 1 && v.get<double>() <= 60))
        return "seconds must be a number from 1 to 60";
      out->seconds = v.get<double>();
    }
    return "";
  }
  if (cmd == "drain" || cmd == "undrain") {
    out->command = cmd == "drain" ? AdminRequest::Command::kDrain : AdminRequest::Command::kUndrain;
    if (request.contains("gpu") && request["gpu"].is_number_unsigned()) {
      out->gpu = std::to_string(request["gpu"].get<uint64_t>());
      return "";
    }
    if (request.contains("gpu") && request["gpu"].is_string() && !request["gpu"].get<std::string>().empty())
      return text_field(request, "gpu", &out->gpu);
    return cmd + " needs \"gpu\": the index or UUID (GPU-... or MIG-...) of a managed GPU";
  }
  if (cmd == "set") {
    out->command = AdminRequest::Command::kSet;
    if (!(err = text_field(request, "pod", &out->pod)).empty()) return err;
    return policy_map(request.contains("values") ? request["values"] : json(), "values",
                      &out->values);
  }
  if (cmd == "unset") {
    out->command = AdminRequest::Command::kUnset;
    if (!(err = text_field(request, "pod", &out->pod)).empty()) return err;
    if (out->pod.empty()) return "unset needs \"pod\": the pod's key (namespace/name)";
    if (request.contains("keys") && !request["keys"].is_null()) {
      const json& keys = request["keys"];
      if (!keys.is_array()) return "keys must be an array of policy keys (weight, priority, ...)";
      for (const json& k : keys) {
        if (!k.is_string()) return "keys must be an array of policy keys (weight, priority, ...)";
        out->keys.push_back(k.get<std::string>());
        if (!(err = hosted::check_text(out->keys.back(), "keys", 64)).empty()) return err;
      }
    }
    return "";
  }
  if (cmd == "policy") {
    out->command = AdminRequest::Command::kPolicy;
    return text_field(request, "pod", &out->pod);
  }
  if (cmd == "register") {
    out->command = AdminRequest::Command::kRegister;
    Registration& r = out->registration;
    for (auto [name, field] :
         {std::pair{"container_id", &r.container_id}, std::pair{"pod_uid", &r.pod_uid},
          std::pair{"pod_name", &r.pod_name}, std::pair{"pod_namespace", &r.pod_namespace},
          std::pair{"container_name", &r.container_name},
          std::pair{"cgroup_path", &r.cgroup_path}}) {
      if (!(err = text_field(request, name, field)).empty()) return err;
    }
    if (request.contains("devices") && !request["devices"].is_null()) {
      const json& devices = request["devices"];
      if (!devices.is_array()) return "devices must be an array of GPU/MIG UUIDs";
      for (const json& d : devices) {
        if (!d.is_string()) return "devices must be an array of GPU/MIG UUIDs";
        r.devices.push_back(d.get<std::string>());
      }
    }
    return policy_map(request.contains("policy") ? request["policy"] : json(), "policy", &r.policy);
  }
  if (cmd == "unregister") {
    out->command = AdminRequest::Command::kUnregister;
    return text_field(request, "container_id", &out->container_id);
  }
  return "unknown cmd \"" + hosted::printable(cmd) +
         "\": use status, top, explain, set, unset, policy, register, unregister, drain, undrain "
         "or devices";
}

}  // namespace quanta::arbiter
