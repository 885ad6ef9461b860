// Arbitrary bytes as a bundle's config.json, through everything create-runtime derives from
// it before talking to the arbiter: pod identity, annotations, GPU evidence and its
// resolution (against a fixed device table), and the same bytes as /proc/<pid>/cgroup.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/cgroup.h"
#include "hooks/annotations.h"
#include "hooks/bundle.h"
#include "hooks/cgroup.h"
#include "hooks/devices.h"
#include "hooks/pod_identity.h"
#include "tests/fuzz/fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace quanta::hooks;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const BundleConfig c = parse_bundle_config(text, "/run/bundle");
    if (c.root_path.empty() || c.root_path[0] != '/') std::abort();
    const PodIdentity p = pod_identity(c.annotations, "fuzz");
    if (p.key().empty()) std::abort();
    validate_annotations(c.annotations, quanta::common::Policy{});
    std::vector<std::string> notes;
    const auto devices = resolve_devices(gather_device_evidence(c),
                                         [] {
                                           DeviceTable t;
                                           t.entries = {{"0", "GPU-00000000-0000-0000-0000-000000000000", 0, false},
                                                        {"0:0", "MIG-00000000-0000-0000-0000-000000000001", 0, true}};
                                           return t;
                                         },
                                         &notes);
    for (const std::string& d : devices)
      if (d.rfind("GPU-", 0) != 0 && d.rfind("MIG-", 0) != 0) std::abort();
  } catch (const HookError& e) {
    check_refusal(e);
  }
  const std::string_view path = quanta::common::container_cgroup_path(text);
  if (!path.empty() && path[0] != '/') std::abort();
  try {
    container_cgroup_from(std::string(text), "0::/runtime\n", 1);
  } catch (const HookError& e) {
    check_refusal(e);
  }
  return 0;
}
