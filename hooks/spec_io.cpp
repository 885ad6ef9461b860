// yaml-cpp <-> nlohmann::json. YAML scalars keep their type the way CDI's Go loader reads
// them: quoted scalars are strings, plain ones that read as integers, booleans or null are
// those, everything else a string. Written YAML double-quotes every string, so a device
// named "0" or "0:1" stays a string for any reader.
#include "hooks/spec_io.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "hooks/error.h"
#include "hooks/json_fields.h"

namespace quanta::hooks {
namespace {

constexpr int kMaxDepth = 64;

// CDI specs are UTF-8 (the Go loader's strings are); refusing anything else here keeps
// every later step (JSON output, the YAML emitter) on text it can represent.
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n = 0;
    uint32_t cp = 0;
    if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= n) return false;
    for (size_t k = 1; k <= n; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    const uint32_t least[] = {0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

const std::string& utf8(const std::string& s) {
  if (!valid_utf8(s)) throw HookError("a YAML string is not UTF-8");
  return s;
}

nlohmann::json scalar(const YAML::Node& node) {
  const std::string& text = utf8(node.Scalar());
  if (node.Tag() == "!") return text;  // quoted
  if (text == "null" || text == "~" || text.empty()) return nullptr;
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  if (text.find_first_not_of("+-0123456789") == std::string::npos) {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno == 0 && end != nullptr && *end == '\0') return v;
    errno = 0;
    const unsigned long long u = std::strtoull(text.c_str(), &end, 10);
    if (errno == 0 && end != nullptr && *end == '\0' && text[0] != '-') return u;
  }
  if (text.find_first_not_of("+-0123456789.eE") == std::string::npos &&
      text.find_first_of("0123456789") != std::string::npos) {
    char* end = nullptr;
    const double d = std::strtod(text.c_str(), &end);
    if (end != nullptr && *end == '\0' && std::isfinite(d)) return d;
  }
  return text;
}

nlohmann::json from_yaml(const YAML::Node& node, int depth) {
  if (depth > kMaxDepth) throw HookError("YAML nested deeper than 64 levels");
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return nullptr;
    case YAML::NodeType::Scalar: return scalar(node);
    case YAML::NodeType::Sequence: {
      nlohmann::json out = nlohmann::json::array();
      for (const YAML::Node& item : node) out.push_back(from_yaml(item, depth + 1));
      return out;
    }
    case YAML::NodeType::Map: {
      nlohmann::json out = nlohmann::json::object();
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) throw HookError("a YAML map key is not a plain string");
        out[utf8(kv.first.Scalar())] = from_yaml(kv.second, depth + 1);
      }
      return out;
    }
  }
  return nullptr;
}

void emit(YAML::Emitter& out, const nlohmann::json& v) {
  if (v.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [k, item] : v.items()) {
      out << YAML::Key << k << YAML::Value;
      emit(out, item);
    }
    out << YAML::EndMap;
  } else if (v.is_array()) {
    out << YAML::BeginSeq;
    for (const auto& item : v) emit(out, item);
    out << YAML::EndSeq;
  } else if (v.is_string()) {
    out << YAML::DoubleQuoted << v.get<std::string>();
  } else if (v.is_boolean()) {
    out << YAML::TrueFalseBool << v.get<bool>();
  } else if (v.is_number_unsigned()) {
    out << v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    out << v.get<int64_t>();
  } else if (v.is_null()) {
    out << YAML::Null;
  } else {
    out << v.dump();  // a float, printed so it reads back the same
  }
}

}  // namespace

SpecFormat parse_format(const std::string& text) {
  if (text == "yaml") return SpecFormat::kYaml;
  if (text == "json") return SpecFormat::kJson;
  throw HookError("format " + shown(text) + " is not allowed: use yaml or json");
}

SpecFormat format_of_path(const std::string& path) {
  auto ends = [&path](const char* ext) {
    const std::string e(ext);
    return path.size() > e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0;
  };
  if (ends(".yaml") || ends(".yml")) return SpecFormat::kYaml;
  if (ends(".json")) return SpecFormat::kJson;
  throw HookError(path + " has no .yaml or .json extension (CDI reads only those)");
}

std::string to_text(const nlohmann::json& value, SpecFormat format) {
  if (format == SpecFormat::kJson)
    return value.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  YAML::Emitter out;
  emit(out, value);
  if (!out.good()) throw HookError("cannot write the spec as YAML: " + out.GetLastError());
  return "---\n" + std::string(out.c_str()) + "\n";
}

nlohmann::json parse_spec_text(std::string_view text, SpecFormat format, const std::string& what) {
  if (format == SpecFormat::kJson) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw HookError(what + " is not valid JSON: " + e.what());
    }
    check_depth(j, what);
    return j;
  }
  try {
    return from_yaml(YAML::Load(std::string(text)), 0);
  } catch (const YAML::Exception& e) {
    throw HookError(what + " is not valid YAML: " + e.what());
  }
}

nlohmann::json read_spec_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw HookError("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_spec_text(text.str(), format_of_path(path), path);
}

}  // namespace quanta::hooks
