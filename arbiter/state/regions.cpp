// Creating, sealing, validating and re-adopting the arbiter's memfd regions.
#include "arbiter/state/regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/shm_layout_2.h"
#include "common/version.h"
#include "hosted/errno_text.h"

namespace quanta::arbiter {
namespace {

template <typename T>
constexpr bool kIsControl = std::is_same_v<T, common::ControlRegion> ||
                            std::is_same_v<T, common::layout2::ControlRegion>;

template <typename T>
constexpr uint32_t layout_of() {
  if constexpr (std::is_same_v<T, common::ControlRegion> || std::is_same_v<T, common::PodRegion>) {
    return common::kLayoutVersion;
  } else {
    return common::layout2::kVersion;
  }
}

// The bytes a region of `kind` has in `layout` (an accepted one).
size_t size_in_layout(bool control, uint32_t layout) {
  if (control) {
    return layout == common::layout2::kVersion ? sizeof(common::layout2::ControlRegion)
                                               : sizeof(common::ControlRegion);
  }
  return layout == common::layout2::kVersion ? sizeof(common::layout2::PodRegion)
                                             : sizeof(common::PodRegion);
}

std::string check_common(const void* bytes, size_t size, bool control) {
  const char* kind = control ? "control" : "pod";
  uint32_t head[3];
  if (bytes == nullptr || size < sizeof(head)) {
    return std::string(kind) + " region has " + std::to_string(size) +
           " bytes, fewer than its header";
  }
  std::memcpy(head, bytes, sizeof(head));
  if (head[0] != (control ? common::kControlMagic : common::kPodMagic))
    return std::string(kind) + " region has a foreign magic";
  if (!common::kSharedMemoryLayout.accepts(head[1])) {
    return std::string(kind) + " region has shared-memory layout " + std::to_string(head[1]) +
           "; this arbiter (release " + common::release() + ") speaks " +
           std::to_string(common::kSharedMemoryLayout.speaks) + " and accepts " +
           common::accepted_range(common::kSharedMemoryLayout);
  }
  const size_t expected = size_in_layout(control, head[1]);
  if (size < expected) {
    return std::string(kind) + " region has " + std::to_string(size) + " bytes, layout " +
           std::to_string(head[1]) + " needs " + std::to_string(expected);
  }
  if (head[2] != expected) {
    return std::string(kind) + " region says it has " + std::to_string(head[2]) +
           " bytes, layout " + std::to_string(head[1]) + " has " + std::to_string(expected);
  }
  return "";
}

}  // namespace

std::string control_region_name(const std::string& scope, uint32_t gpu_index) {
  return scope + ".gpu." + std::to_string(gpu_index);
}

std::string pod_region_name(const std::string& scope, uint32_t pod_index) {
  return scope + ".pod." + std::to_string(pod_index);
}

std::string check_control_header(const void* bytes, size_t size) {
  return check_common(bytes, size, true);
}

std::string check_pod_header(const void* bytes, size_t size, uint64_t recovery_tag) {
  std::string err = check_common(bytes, size, false);
  if (!err.empty()) return err;
  common::PodHeader header;
  std::memcpy(static_cast<void*>(&header), bytes, sizeof(header));
  if (header.recovery_tag != recovery_tag)
    return "pod region's recovery tag is not the one recorded for it";
  return "";
}

uint64_t inode_of(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

int seals_of(int fd) {
  return fcntl(fd, F_GET_SEALS);
}

template <typename T>
Region<T>& Region<T>::operator=(Region&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) munmap(map_, sizeof(T));
    name_ = std::move(other.name_);
    fd_ = std::move(other.fd_);
    tenant_fd_ = std::move(other.tenant_fd_);
    map_ = other.map_;
    inode_ = other.inode_;
    other.map_ = nullptr;
    other.inode_ = 0;
  }
  return *this;
}

template <typename T>
Region<T>::~Region() {
  if (map_ != nullptr) munmap(map_, sizeof(T));
}

template <typename T>
Region<T> Region<T>::create(const std::string& name) {
  constexpr bool kControl = kIsControl<T>;
  Region r;
  r.name_ = name;
  r.fd_.reset(memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!r.fd_) throw RegionError("memfd_create(" + name + "): " + hosted::errno_text(errno));
  if (ftruncate(r.fd_.get(), static_cast<off_t>(sizeof(T))) != 0)
    throw RegionError("sizing region " + name + ": " + hosted::errno_text(errno));
  void* p = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED, r.fd_.get(), 0);
  if (p == MAP_FAILED) throw RegionError("mapping region " + name + ": " + hosted::errno_text(errno));
  r.map_ = p;
  auto& header = r.get()->header;
  header.magic = kControl ? common::kControlMagic : common::kPodMagic;
  header.version = layout_of<T>();
  header.size = static_cast<uint32_t>(sizeof(T));
  // The arbiter's mapping exists now; sealing FUTURE_WRITE keeps it writable and makes
  // every later writable mapping, write(2) and hole punch fail, whoever asks.
  if (fcntl(r.fd_.get(), F_ADD_SEALS, kControl ? kControlSeals : kRegionSeals) != 0)
    throw RegionError("sealing region " + name + ": " + hosted::errno_text(errno));
  if constexpr (kControl) {
    const std::string self = "/proc/self/fd/" + std::to_string(r.fd_.get());
    r.tenant_fd_.reset(::open(self.c_str(), O_RDONLY | O_CLOEXEC));
    if (!r.tenant_fd_)
      throw RegionError("reopening region " + name + " read-only: " + hosted::errno_text(errno));
  }
  r.inode_ = inode_of(r.fd_.get());
  return r;
}

template <typename T>
Region<T> Region<T>::adopt(UniqueFd fd, const std::string& name, uint64_t recovery_tag) {
  // Control regions are never written again once their arbiter is gone (their seals forbid
  // it): a restarted arbiter makes new ones, so only pod regions come back here.
  if constexpr (kIsControl<T>) {
    (void)recovery_tag;
    throw RegionError("control region " + name + " cannot be re-adopted for writing");
  }
  const int seals = seals_of(fd.get());
  if (seals != kRegionSeals) {
    throw RegionError("region " + name + " does not carry exactly the seals this arbiter sets (" +
                      std::to_string(seals) + ")");
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || static_cast<size_t>(st.st_size) != sizeof(T)) {
    throw RegionError("region " + name + " has " + std::to_string(st.st_size) +
                      " bytes, the layout has " + std::to_string(sizeof(T)));
  }
  void* p = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) throw RegionError("mapping region " + name + ": " + hosted::errno_text(errno));
  Region r;
  r.name_ = name;
  r.fd_ = std::move(fd);
  r.map_ = p;
  r.inode_ = static_cast<uint64_t>(st.st_ino);
  std::string err = check_pod_header(p, sizeof(T), recovery_tag);
  if (err.empty() && r.get()->header.version != layout_of<T>())
    err = "pod region " + name + " is not of layout " + std::to_string(layout_of<T>());
  if (!err.empty()) throw RegionError(err);
  return r;
}

template class Region<common::ControlRegion>;
template class Region<common::PodRegion>;
template class Region<common::layout2::ControlRegion>;
template class Region<common::layout2::PodRegion>;

PodRegionMap PodRegionMap::create(const std::string& name, uint32_t layout) {
  PodRegionMap r;
  if (layout == common::layout2::kVersion) {
    r.v2_ = Region<common::layout2::PodRegion>::create(name);
  } else if (layout == common::kLayoutVersion) {
    r.v3_ = Region<common::PodRegion>::create(name);
  } else {
    throw RegionError("no pod region of shared-memory layout " + std::to_string(layout) +
                      ": this arbiter accepts " + common::accepted_range(common::kSharedMemoryLayout));
  }
  return r;
}

PodRegionMap PodRegionMap::adopt(UniqueFd fd, const std::string& name, uint64_t recovery_tag) {
  uint32_t head[3] = {0, 0, 0};
  if (pread(fd.get(), head, sizeof(head), 0) != static_cast<ssize_t>(sizeof(head)))
    throw RegionError("region " + name + " has no header to read");
  PodRegionMap r;
  if (head[1] == common::layout2::kVersion) {
    r.v2_ = Region<common::layout2::PodRegion>::adopt(std::move(fd), name, recovery_tag);
  } else {
    r.v3_ = Region<common::PodRegion>::adopt(std::move(fd), name, recovery_tag);
  }
  return r;
}

ControlSnapshot::ControlSnapshot(const UniqueFd& fd, std::string* why) {
  // Only a region nobody can shrink is read: a truncated file would fault the reader.
  if (seals_of(fd.get()) != kControlSeals) {
    *why = "the old control region does not carry the seals this arbiter sets";
    return;
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 ||
      static_cast<size_t>(st.st_size) < sizeof(common::ControlRegion)) {
    *why = "the old control region is smaller than the layout";
    return;
  }
  void* p = mmap(nullptr, sizeof(common::ControlRegion), PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    *why = "cannot map the old control region: " + hosted::errno_text(errno);
    return;
  }
  *why = check_control_header(p, sizeof(common::ControlRegion));
  if (!why->empty()) {
    munmap(p, sizeof(common::ControlRegion));
    return;
  }
  map_ = static_cast<const common::ControlRegion*>(p);
  layout_ = map_->header.version;
}

ControlSnapshot& ControlSnapshot::operator=(ControlSnapshot&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) munmap(const_cast<common::ControlRegion*>(map_), sizeof(*map_));
    map_ = other.map_;
    layout_ = other.layout_;
    other.map_ = nullptr;
  }
  return *this;
}

ControlSnapshot::~ControlSnapshot() {
  if (map_ != nullptr) munmap(const_cast<common::ControlRegion*>(map_), sizeof(*map_));
}

}  // namespace quanta::arbiter
