// Feeds arbitrary bytes to what reads text or memory a tenant controls: the region header
// checks (a pod region is tenant-writable), the recovery scan's /proc/<pid>/maps parser
// (memfd names are the tenant's choice) and the cgroup device-list parser.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "arbiter/state/device_access.h"
#include "arbiter/state/region_recovery.h"
#include "arbiter/state/regions.h"
#include "common/shm_layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace quanta;
  uint64_t tag = 0;
  if (size >= 8) std::memcpy(&tag, data, 8);
  (void)arbiter::check_pod_header(data, size, tag);
  (void)arbiter::check_control_header(data, size);
  // A full-size pod region whose header comes from the input.
  std::vector<unsigned char> region(sizeof(common::PodRegion), 0);
  std::memcpy(region.data(), data, std::min(size, region.size()));
  (void)arbiter::check_pod_header(region.data(), region.size(), tag);

  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const arbiter::MemfdMapping& m : arbiter::memfd_mappings(text, "quanta")) {
    if (m.name.rfind("quanta.", 0) != 0 || m.range.find('-') == std::string::npos) std::abort();
  }
  const std::vector<arbiter::GpuInfo> gpus = {
      {"GPU-a", "", 0, "0", ""}, {"MIG-a1", "GPU-a", 0, "0:0", ""}, {"GPU-b", "", 1, "1", ""}};
  arbiter::DeviceGrant g = arbiter::devices_in_cgroup_list(text, gpus);
  for (const std::string& u : g.uuids) {
    if (u != "GPU-a" && u != "MIG-a1" && u != "GPU-b") std::abort();
  }
  return 0;
}
