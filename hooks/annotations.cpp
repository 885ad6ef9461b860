// Annotation validation: the quanta.dev/ prefix is ours alone, so an unknown key under it
// is a mistake to refuse (a typo must not silently drop a memory cap).
#include "hooks/annotations.h"

#include <cctype>

#include "config/node_config.h"
#include "hooks/error.h"

namespace quanta::hooks {
namespace {

// The parser's own list of the keys it takes ("allowed keys are weight, ..."), as it says
// it for a key it does not know.
std::string allowed_keys() {
  common::Policy scratch;
  std::string err = config::apply_policy_value(&scratch, "", "");
  const size_t at = err.find("allowed keys");
  return at == std::string::npos ? err : err.substr(at);
}

}  // namespace

PodPolicy validate_annotations(const std::map<std::string, std::string>& annotations,
                               const common::Policy& defaults) {
  PodPolicy p;
  p.resolved = defaults;
  for (const auto& [key, value] : annotations) {
    if (key.compare(0, kAnnotationPrefix.size(), kAnnotationPrefix) != 0) continue;
    const std::string name = key.substr(kAnnotationPrefix.size());
    // Kubernetes keeps annotation keys to [A-Za-z0-9._/-]; anything else is shown quoted.
    bool plain = true;
    for (unsigned char c : key) plain = plain && (std::isalnum(c) || c == '.' || c == '_' || c == '-' || c == '/');
    const std::string shown_key = plain ? key : shown(key);
    std::string err = name.empty() || name.find('/') != std::string::npos
                          ? "unknown policy key " + shown(name) + ": " + allowed_keys()
                          : config::apply_policy_value(&p.resolved, name, value);
    if (err.empty()) {
      p.values[name] = value;
      continue;
    }
    if (err.find("allowed keys") != std::string::npos)
      err += " (as annotations: " + std::string(kAnnotationPrefix) + "<key>)";
    throw HookError("annotation " + shown_key + " = " + shown(value) + " is refused: " + err);
  }
  return p;
}

}  // namespace quanta::hooks
