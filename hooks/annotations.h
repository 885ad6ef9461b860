// The pod's quanta.dev/* annotations, validated by the parser the node config and
// `quantactl set` use (config/node_config.h apply_policy_value), so every form one accepts the
// others accept too. docs/annotations.md lists them; a test holds the two together.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "common/policy.h"

namespace quanta::hooks {

constexpr std::string_view kAnnotationPrefix = "quanta.dev/";

struct PodPolicy {
  std::map<std::string, std::string> values;  // key without the prefix -> text, as annotated
  common::Policy resolved;                    // the node's defaults with the values applied
  bool capped() const { return resolved.memory_limit != 0; }
};

// Every quanta.dev/* annotation must be a known key with a valid value; the first that is
// not throws HookError naming the annotation, its value and what is allowed.
PodPolicy validate_annotations(const std::map<std::string, std::string>& annotations,
                               const common::Policy& defaults);

}  // namespace quanta::hooks
