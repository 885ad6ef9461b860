// The shared-memory regions the arbiter owns (common/shm_layout.h): one control region per
// GPU and one pod region per pod, created with Boost.Interprocess under
// "/<scope>.gpu.<i>" and "/<scope>.pod.<i>", re-opened and validated after a restart.
#pragma once

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/shm_layout.h"

namespace quanta::arbiter {

class RegionError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string control_region_name(const std::string& scope, uint32_t gpu_index);
std::string pod_region_name(const std::string& scope, uint32_t pod_index);
// Indexes of the pod regions that exist for this scope (after a restart).
std::vector<uint32_t> existing_pod_regions(const std::string& scope);

// One mapped region of type T. open_or_create re-opens an existing region after checking
// its magic, version and size (a mismatched version is refused: tenants still map it),
// or creates a zeroed one with mode 0600.
template <typename T>
class Region {
 public:
  Region() = default;
  Region(const std::string& name, uint32_t magic);
  Region(Region&&) noexcept = default;
  Region& operator=(Region&& other) noexcept;
  ~Region();

  T* get() const { return static_cast<T*>(mapping_.get_address()); }
  T* operator->() const { return get(); }
  const std::string& name() const { return name_; }
  bool reopened() const { return reopened_; }
  // A new descriptor for a tenant: read-only or read-write.
  int open_fd(bool writable) const;
  // Removes the name (tenants keep their mappings).
  void unlink();
  // True when the file was truncated under us (pod regions are guarded, see fault_guard.h).
  bool faulted() const;

 private:
  std::string name_;
  boost::interprocess::shared_memory_object shm_;
  boost::interprocess::mapped_region mapping_;
  bool reopened_ = false;
};

using ControlRegionMap = Region<common::ControlRegion>;
using PodRegionMap = Region<common::PodRegion>;

}  // namespace quanta::arbiter
