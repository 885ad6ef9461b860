// The shared-memory regions the arbiter owns (common/shm_layout.h): one control region per
// GPU and one pod region per pod, and for the pods of the previous release's shims, regions
// of its layout (common/shm_layout_2.h): a second control region per GPU where they run. Each is a sealed memfd, never a file anyone can open by
// name: nobody can resize one (F_SEAL_SHRINK|F_SEAL_GROW), the seals are final
// (F_SEAL_SEAL), and a control region can be written only through the mapping the arbiter
// made before sealing it (F_SEAL_FUTURE_WRITE), so a tenant that is root in its container
// can reopen its descriptor read-write and still not write a byte or cause a SIGBUS.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "arbiter/loop/event_loop.h"
#include "common/shm_layout.h"
#include "common/shm_layout_2.h"

namespace quanta::arbiter {

class RegionError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// memfd names, shown in a tenant's /proc/<pid>/maps as "/memfd:<name> (deleted)".
std::string control_region_name(const std::string& scope, uint32_t gpu_index);
std::string pod_region_name(const std::string& scope, uint32_t pod_index);

// The seals every region carries, and the one control regions add.
constexpr int kRegionSeals = 0x0001 /* SEAL */ | 0x0002 /* SHRINK */ | 0x0004 /* GROW */;
constexpr int kControlSeals = kRegionSeals | 0x0010 /* FUTURE_WRITE */;

// Checks what a previous arbiter's region says about itself before anything trusts it:
// size, magic, layout version (one this arbiter accepts) and the size of that layout; for a
// pod region also the recovery tag the state file recorded. "" or one line saying what is
// wrong. Pure (fuzzed).
std::string check_control_header(const void* bytes, size_t size);
std::string check_pod_header(const void* bytes, size_t size, uint64_t recovery_tag);

// One mapped region of type T.
template <typename T>
class Region {
 public:
  Region() = default;
  Region(Region&& other) noexcept { *this = std::move(other); }
  Region& operator=(Region&& other) noexcept;
  ~Region();

  // A new zeroed region with its header filled in, sealed. Throws RegionError.
  static Region create(const std::string& name);
  // A previous arbiter's pod region reopened through a tenant's mapping: it must carry
  // exactly the seals this arbiter sets, have the layout's size and a valid header with
  // `recovery_tag`. Throws RegionError naming what was wrong.
  static Region adopt(UniqueFd fd, const std::string& name, uint64_t recovery_tag);

  T* get() const { return static_cast<T*>(map_); }
  T* operator->() const { return get(); }
  explicit operator bool() const { return map_ != nullptr; }
  const std::string& name() const { return name_; }
  uint64_t inode() const { return inode_; }
  // The descriptor tenants receive: read-write for a pod region (they map it writable),
  // read-only for a control region (whose seals refuse writes through any descriptor).
  int tenant_fd() const { return tenant_fd_ ? tenant_fd_.get() : fd_.get(); }

 private:
  std::string name_;
  UniqueFd fd_;         // the arbiter's own descriptor
  UniqueFd tenant_fd_;  // control regions: a read-only description of the same memfd
  void* map_ = nullptr;
  uint64_t inode_ = 0;
};

using ControlRegionMap = Region<common::ControlRegion>;
using ControlRegion2Map = Region<common::layout2::ControlRegion>;

// A pod's region in the layout its processes' shims map: 3, or 2 for a pod of the previous
// release. Everything the arbiter reads or writes in a pod region goes through here.
class PodRegionMap {
 public:
  // A new region of `layout` (an accepted one). Throws RegionError.
  static PodRegionMap create(const std::string& name, uint32_t layout);
  // A previous arbiter's region, in whichever accepted layout its header says (Region::adopt).
  static PodRegionMap adopt(UniqueFd fd, const std::string& name, uint64_t recovery_tag);

  explicit operator bool() const { return v3_ || v2_; }
  uint32_t layout() const { return v2_ ? common::layout2::kVersion : common::kLayoutVersion; }
  const std::string& name() const { return v2_ ? v2_.name() : v3_.name(); }
  uint64_t inode() const { return v2_ ? v2_.inode() : v3_.inode(); }
  int tenant_fd() const { return v2_ ? v2_.tenant_fd() : v3_.tenant_fd(); }

  common::PodHeader& header() const { return v2_ ? v2_->header : v3_->header; }
  std::atomic<uint64_t>& memory_used(uint32_t gpu) const {
    return v2_ ? v2_->memory_used[gpu] : v3_->memory_used[gpu];
  }
  std::atomic<uint64_t>& alloc_denied(uint32_t gpu) const {
    return v2_ ? v2_->alloc_denied[gpu] : v3_->alloc_denied[gpu];
  }
  std::atomic<uint32_t>& pid(uint32_t entry) const {
    return v2_ ? v2_->procs[entry].pid : v3_->procs[entry].pid;
  }
  common::GateChannel& channel(uint32_t entry, uint32_t gpu) const {
    return v2_ ? v2_->procs[entry].gpus[gpu] : v3_->procs[entry].gpus[gpu];
  }
  // Layout 3 only; nullptr in layout 2, whose caps and limits are in the control slots.
  std::atomic<uint64_t>* memory_cap(uint32_t gpu) const {
    return v2_ ? nullptr : &v3_->memory_cap[gpu];
  }
  common::GateLimits* limits(uint32_t entry, uint32_t gpu) const {
    return v2_ ? nullptr : &v3_->procs[entry].limits[gpu];
  }

 private:
  Region<common::PodRegion> v3_;
  Region<common::layout2::PodRegion> v2_;
};

// A previous arbiter's control region, mapped read-only to carry its slots over.
class ControlSnapshot {
 public:
  ControlSnapshot() = default;
  // Maps `fd` read-only after checking its size and header; empty on any mismatch (`why`).
  ControlSnapshot(const UniqueFd& fd, std::string* why);
  ControlSnapshot(ControlSnapshot&& other) noexcept { *this = std::move(other); }
  ControlSnapshot& operator=(ControlSnapshot&& other) noexcept;
  ~ControlSnapshot();
  // Its layout (2 or 3): the header is the same in both, the slots are read by the layout.
  uint32_t layout() const { return layout_; }
  const common::ControlRegion* get() const { return map_; }
  const common::layout2::ControlRegion* get2() const {
    return reinterpret_cast<const common::layout2::ControlRegion*>(map_);
  }
  explicit operator bool() const { return map_ != nullptr; }

 private:
  const common::ControlRegion* map_ = nullptr;
  uint32_t layout_ = 0;
};

// The inode of an open file (0 when fstat fails).
uint64_t inode_of(int fd);
// The seals of a memfd (-1 when it has none or is no memfd).
int seals_of(int fd);

}  // namespace quanta::arbiter
