// Reading and writing the state file with nlohmann-json, one entry at a time.
#include "arbiter/state/state_file.h"

#include <limits>
#include <nlohmann/json.hpp>

namespace quanta::arbiter {
namespace {

using nlohmann::json;

constexpr size_t kMaxPidsPerPod = 4096;

std::string string_field(const json& j, const char* name) {
  if (!j.contains(name)) return "";
  const json& v = j.at(name);
  if (!v.is_string()) throw std::runtime_error(std::string(name) + " is not a string");
  return v.get<std::string>();
}

uint32_t index_of(const std::string& text) {
  if (text.empty() || text.size() > 6 || text.find_first_not_of("0123456789") != std::string::npos)
    throw std::runtime_error("index \"" + text + "\" is not a small number");
  return static_cast<uint32_t>(std::stoul(text));
}

uint64_t unsigned_field(const json& j, const char* name) {
  if (!j.contains(name)) return 0;
  const json& v = j.at(name);
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  // Tags are written as hex strings: JSON readers elsewhere lose 64-bit integers.
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s.empty() || s.size() > 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw std::runtime_error(std::string(name) + " is not a hex number");
    return std::stoull(s, nullptr, 16);
  }
  throw std::runtime_error(std::string(name) + " is not an unsigned number");
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string what(const std::exception& e) {
  return e.what();
}

// Each entry below is read alone: a bad one throws, is named in a warning and is dropped.

Registration registration_entry(const json& r) {
  if (!r.is_object()) throw std::runtime_error("not an object");
  Registration reg;
  reg.container_id = string_field(r, "container_id");
  reg.pod_uid = string_field(r, "pod_uid");
  reg.pod_name = string_field(r, "pod_name");
  reg.pod_namespace = string_field(r, "pod_namespace");
  reg.container_name = string_field(r, "container_name");
  reg.cgroup_path = string_field(r, "cgroup_path");
  if (r.contains("devices")) {
    for (const json& d : r.at("devices")) {
      if (!d.is_string()) throw std::runtime_error("a device is not a string");
      reg.devices.push_back(d.get<std::string>());
    }
  }
  if (r.contains("policy")) {
    const json& p = r.at("policy");
    if (!p.is_object()) throw std::runtime_error("policy is not an object");
    for (const auto& [k, v] : p.items()) {
      if (!v.is_string()) throw std::runtime_error("policy value of " + k + " is not a string");
      reg.policy[k] = v.get<std::string>();
    }
  }
  return reg;
}

std::map<std::string, std::string> override_entry(const json& values) {
  if (!values.is_object()) throw std::runtime_error("not an object");
  std::map<std::string, std::string> kv;
  for (const auto& [k, v] : values.items()) {
    if (!v.is_string()) throw std::runtime_error("value of " + k + " is not a string");
    kv[k] = v.get<std::string>();
  }
  return kv;
}

SavedPod pod_entry(const json& p) {
  SavedPod pod;
  if (!p.is_object()) throw std::runtime_error("not an object");
  pod.key = string_field(p, "key");
  if (pod.key.empty()) throw std::runtime_error("no key");
  pod.inode = unsigned_field(p, "inode");
  pod.recovery_tag = unsigned_field(p, "tag");
  pod.claimed_from = string_field(p, "claimed_from");
  if (p.contains("pids")) {
    const json& pids = p.at("pids");
    if (!pids.is_array() || pids.size() > kMaxPidsPerPod)
      throw std::runtime_error("pids is not a list of at most 4096");
    for (const json& pid : pids) {
      if (!pid.is_number_unsigned() || pid.get<uint64_t>() == 0 ||
          pid.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<pid_t>::max()))
        throw std::runtime_error("a pid is not a positive number");
      pod.pids.push_back(static_cast<pid_t>(pid.get<uint64_t>()));
    }
  }
  return pod;
}

SavedGpu gpu_entry(const json& g) {
  if (!g.is_object()) throw std::runtime_error("not an object");
  SavedGpu gpu;
  gpu.uuid = string_field(g, "uuid");
  if (g.contains("inodes")) {
    const json& inodes = g["inodes"];
    if (!inodes.is_array() || inodes.size() > 2)
      throw std::runtime_error("inodes is not a list of at most 2");
    for (const json& inode : inodes) {
      if (!inode.is_number_unsigned()) throw std::runtime_error("an inode is not a number");
      gpu.inodes.push_back(inode.get<uint64_t>());
    }
  } else {
    gpu.inodes.push_back(unsigned_field(g, "inode"));
  }
  return gpu;
}

void read_registrations(const json& regs, SavedState& out, std::vector<std::string>* warnings) {
  if (!regs.is_array()) {
    warnings->push_back("registrations is not a list: none kept");
    return;
  }
  for (size_t i = 0; i < regs.size(); ++i) {
    try {
      out.registrations.push_back(registration_entry(regs[i]));
    } catch (const std::exception& e) {
      warnings->push_back("registration #" + std::to_string(i) + " dropped: " + what(e));
    }
  }
}

void read_overrides(const json& ov, SavedState& out, std::vector<std::string>* warnings) {
  if (!ov.is_object()) {
    warnings->push_back("overrides is not an object: none kept");
    return;
  }
  for (const auto& [pod, values] : ov.items()) {
    try {
      std::map<std::string, std::string> values_read = override_entry(values);
      out.overrides[pod] = std::move(values_read);
    } catch (const std::exception& e) {
      warnings->push_back("settings of pod " + pod + " dropped: " + what(e));
    }
  }
}

// A section keyed by index (pod regions, GPUs): `not_object` is the warning when the section
// is no object, `entry_name` names a dropped entry in its warning.
template <typename Entry>
void read_indexed(const json& section, std::map<uint32_t, Entry>& into,
                  Entry (*read_entry)(const json&), const char* not_object,
                  const char* entry_name, std::vector<std::string>* warnings) {
  if (!section.is_object()) {
    warnings->push_back(not_object);
    return;
  }
  for (const auto& [index, value] : section.items()) {
    try {
      const uint32_t i = index_of(index);
      Entry entry = read_entry(value);
      into[i] = std::move(entry);
    } catch (const std::exception& e) {
      warnings->push_back(std::string(entry_name) + " " + index + " dropped: " + what(e));
    }
  }
}

}  // namespace

SavedState parse_state(std::string_view text, std::vector<std::string>* warnings) {
  SavedState out;
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    warnings->push_back("not a JSON object: ignoring all of it");
    return out;
  }
  if (root.contains("generation")) {
    try {
      out.generation = unsigned_field(root, "generation");
    } catch (const std::exception& e) {
      warnings->push_back("generation: " + what(e));
    }
  }
  if (root.contains("registrations")) read_registrations(root["registrations"], out, warnings);
  if (root.contains("overrides")) read_overrides(root["overrides"], out, warnings);
  if (root.contains("pods")) {
    read_indexed(root["pods"], out.pods, &pod_entry,
                 "pods is not an object: no pod region will be re-adopted", "pod region", warnings);
  }
  if (root.contains("gpus"))
    read_indexed(root["gpus"], out.gpus, &gpu_entry, "gpus is not an object", "GPU", warnings);
  if (root.contains("slot_key")) {
    try {
      out.slot_key = string_field(root, "slot_key");
    } catch (const std::exception& e) {
      warnings->push_back("slot_key: " + what(e));
    }
  }
  return out;
}

std::string render_registration(const Registration& r) {
  const json j{{"container_id", r.container_id},   {"pod_uid", r.pod_uid},
               {"pod_name", r.pod_name},           {"pod_namespace", r.pod_namespace},
               {"container_name", r.container_name}, {"cgroup_path", r.cgroup_path},
               {"devices", r.devices},             {"policy", r.policy}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string render_state(const SavedState& state,
                         const std::vector<std::string_view>& registration_texts) {
  json j;
  j["version"] = 2;
  j["generation"] = state.generation;
  j["overrides"] = json::object();
  for (const auto& [pod, values] : state.overrides) j["overrides"][pod] = values;
  j["pods"] = json::object();
  for (const auto& [index, p] : state.pods) {
    json& pod = j["pods"][std::to_string(index)];
    pod = {{"key", p.key}, {"inode", p.inode}, {"tag", hex(p.recovery_tag)}, {"pids", p.pids}};
    if (!p.claimed_from.empty()) pod["claimed_from"] = p.claimed_from;
  }
  j["gpus"] = json::object();
  for (const auto& [index, g] : state.gpus) {
    json& gpu = j["gpus"][std::to_string(index)];
    gpu = {{"uuid", g.uuid}, {"inodes", g.inodes}};
    if (!g.inodes.empty()) gpu["inode"] = g.inodes.front();
  }
  if (!state.slot_key.empty()) j["slot_key"] = state.slot_key;
  // The rest of the file, then the registrations spliced in first, one line each.
  const std::string rest = j.dump(2, ' ', false, json::error_handler_t::replace);
  size_t size = rest.size() + 64;
  for (std::string_view t : registration_texts) size += t.size() + 6;
  std::string out;
  out.reserve(size);
  out += "{\n  \"registrations\": [";
  for (size_t i = 0; i < registration_texts.size(); ++i) {
    out += i == 0 ? "\n    " : ",\n    ";
    out += registration_texts[i];
  }
  out += registration_texts.empty() ? "],\n" : "\n  ],\n";
  out.append(rest, 2, std::string::npos);  // after "{\n"
  out += "\n";
  return out;
}

std::string render_state(const SavedState& state) {
  std::vector<std::string> texts;
  texts.reserve(state.registrations.size());
  for (const Registration& r : state.registrations) texts.push_back(render_registration(r));
  return render_state(state, std::vector<std::string_view>(texts.begin(), texts.end()));
}

}  // namespace quanta::arbiter
