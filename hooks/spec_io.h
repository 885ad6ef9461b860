// Reading and writing CDI specs and hooks.d files as JSON or YAML. YAML goes through
// yaml-cpp both ways, converted to and from nlohmann::json, so every spec is handled as one
// JSON value whatever its file format.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace quanta::hooks {

enum class SpecFormat { kYaml, kJson };

// "yaml" or "json"; throws HookError otherwise.
SpecFormat parse_format(const std::string& text);
// The format a file name's extension calls for (.yaml, .yml or .json); throws otherwise.
SpecFormat format_of_path(const std::string& path);

std::string to_text(const nlohmann::json& value, SpecFormat format);
// Parses JSON or YAML text (`what` names it in errors); throws HookError.
nlohmann::json parse_spec_text(std::string_view text, SpecFormat format, const std::string& what);
// Reads a spec file, its format taken from the extension.
nlohmann::json read_spec_file(const std::string& path);

}  // namespace quanta::hooks
