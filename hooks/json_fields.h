// Typed field access on parsed JSON for the OCI state and bundle readers: each helper names
// the document and the field in the HookError it throws.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace quanta::hooks {

// Refuses values nested deeper than 64 levels (nothing a runtime or vendor writes comes
// near it); code that walks or prints a value can then recurse without fear.
void check_depth(const nlohmann::json& value, const std::string& what);
// Parses `text` as one JSON object (depth checked); `what` names the document in errors.
nlohmann::json parse_json_object(std::string_view text, const std::string& what);
std::string required_string(const nlohmann::json& j, const char* key, const std::string& what);
std::string optional_string(const nlohmann::json& j, const char* key, const std::string& what);
// An optional object of string values ({} when absent).
std::map<std::string, std::string> string_map(const nlohmann::json& j, const char* key,
                                              const std::string& what);
// Container ids end up in registrations and log lines: printable, no '/', 1-253 bytes.
void check_container_id(const std::string& id);

}  // namespace quanta::hooks
