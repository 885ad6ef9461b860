// The shared field checks behind oci_state.cpp and bundle.cpp, and HookError's quoting.
#include "hooks/json_fields.h"

#include <utility>
#include <vector>

#include "hooks/error.h"

namespace quanta::hooks {

void check_depth(const nlohmann::json& value, const std::string& what) {
  constexpr size_t kMaxDepth = 64;
  std::vector<std::pair<const nlohmann::json*, size_t>> todo = {{&value, 1}};
  while (!todo.empty()) {
    const auto [v, depth] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) continue;
    if (depth > kMaxDepth) throw HookError(what + " is nested deeper than 64 levels");
    for (const auto& item : *v) todo.emplace_back(&item, depth + 1);
  }
}

nlohmann::json parse_json_object(std::string_view text, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw HookError(what + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw HookError(what + " is not a JSON object");
  check_depth(j, what);
  return j;
}

std::string required_string(const nlohmann::json& j, const char* key, const std::string& what) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string() || it->get_ref<const std::string&>().empty())
    throw HookError(what + " has no \"" + key + "\" string");
  return it->get<std::string>();
}

std::string optional_string(const nlohmann::json& j, const char* key, const std::string& what) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  if (!it->is_string())
    throw HookError(what + "'s \"" + key + "\" is " + shown(it->dump()) + ": expected a string");
  return it->get<std::string>();
}

std::map<std::string, std::string> string_map(const nlohmann::json& j, const char* key,
                                              const std::string& what) {
  std::map<std::string, std::string> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_object())
    throw HookError(what + "'s \"" + key + "\" is not an object of strings");
  for (const auto& [k, v] : it->items()) {
    if (!v.is_string())
      throw HookError(what + "'s " + key + " " + shown(k) + " is " + shown(v.dump()) +
                      ": expected a string");
    out[k] = v.get<std::string>();
  }
  return out;
}

void check_container_id(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 253;
  for (unsigned char c : id) ok = ok && c > 0x20 && c < 0x7f && c != '/';
  if (!ok)
    throw HookError("container id " + shown(id) +
                    " is not allowed: use 1 to 253 printable characters without '/' or spaces");
}

}  // namespace quanta::hooks
