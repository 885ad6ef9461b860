// OCI hooks.d files (version 1.0.0, read by CRI-O and podman): one file per stage, each
// running quanta-hook for containers with a quanta.dev/* annotation. hooks.d cannot add
// mounts, so in this form the createContainer stage mounts Quanta's files itself.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "hooks/cdi_spec.h"

namespace quanta::hooks {

// (file name, content) per stage: quanta-create-runtime.json, quanta-create-container.json,
// quanta-poststop.json.
std::vector<std::pair<std::string, nlohmann::json>> hooksd_files(const CdiOptions& options);

}  // namespace quanta::hooks
