// Creating, validating and re-opening the arbiter's shared-memory regions.
#include "arbiter/regions.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <algorithm>
#include <boost/interprocess/exceptions.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "arbiter/fault_guard.h"

namespace quanta::arbiter {
namespace bip = boost::interprocess;

std::string control_region_name(const std::string& scope, uint32_t gpu_index) {
  return "/" + scope + ".gpu." + std::to_string(gpu_index);
}

std::string pod_region_name(const std::string& scope, uint32_t pod_index) {
  return "/" + scope + ".pod." + std::to_string(pod_index);
}

std::vector<uint32_t> existing_pod_regions(const std::string& scope) {
  std::vector<uint32_t> out;
  std::error_code ec;
  const std::string prefix = scope + ".pod.";
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    std::string digits = name.substr(prefix.size());
    if (digits.empty() || digits.size() > 6 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      continue;
    out.push_back(static_cast<uint32_t>(std::stoul(digits)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

template <typename T>
Region<T>::Region(const std::string& name, uint32_t magic) : name_(name) {
  try {
    try {
      shm_ = bip::shared_memory_object(bip::open_only, name.c_str(), bip::read_write);
      reopened_ = true;
    } catch (const bip::interprocess_exception& e) {
      if (e.get_error_code() != bip::not_found_error) throw;
      bip::permissions perms;
      perms.set_permissions(0600);
      shm_ = bip::shared_memory_object(bip::create_only, name.c_str(), bip::read_write, perms);
      shm_.truncate(sizeof(T));
    }
    bip::offset_t size = 0;
    shm_.get_size(size);
    if (reopened_ && static_cast<size_t>(size) <
                         sizeof(typename std::remove_reference_t<decltype(get()->header)>)) {
      throw RegionError("shared-memory region " + name + " exists with " + std::to_string(size) +
                        " bytes, too small for a Quanta header: remove it (rm /dev/shm" + name +
                        ")");
    }
    mapping_ = bip::mapped_region(shm_, bip::read_write, 0, static_cast<size_t>(size));
  } catch (const bip::interprocess_exception& e) {
    throw RegionError("shared-memory region " + name + ": " + e.what());
  }
  // Tenants map pod regions read-write and so could truncate them: guard the mapping.
  if constexpr (std::is_same_v<T, common::PodRegion>) {
    install_fault_guard();
    guard_mapping(get(), mapping_.get_size());
  }
  auto& header = get()->header;
  if (reopened_) {
    if (header.magic != magic) {
      throw RegionError("shared-memory region " + name +
                        " is not a Quanta region of this kind (magic " +
                        std::to_string(header.magic) + "): remove it or use another [node] scope");
    }
    if (header.version != common::kLayoutVersion) {
      throw RegionError(
          "shared-memory region " + name + " has layout version " + std::to_string(header.version) +
          " but this arbiter speaks version " + std::to_string(common::kLayoutVersion) +
          ": stop the tenants that map it and remove it, or run the matching arbiter");
    }
    if (header.size != sizeof(T) || mapping_.get_size() < sizeof(T)) {
      throw RegionError("shared-memory region " + name + " has size " +
                        std::to_string(header.size) + " but layout version " +
                        std::to_string(common::kLayoutVersion) + " needs " +
                        std::to_string(sizeof(T)) + ": remove it");
    }
    return;
  }
  std::memset(static_cast<void*>(get()), 0, sizeof(T));
  header.magic = magic;
  header.version = common::kLayoutVersion;
  header.size = static_cast<uint32_t>(sizeof(T));
}

template <typename T>
Region<T>::~Region() {
  if (void* base = mapping_.get_address()) unguard_mapping(base);
}

template <typename T>
Region<T>& Region<T>::operator=(Region&& other) noexcept {
  if (this != &other) {
    if (void* base = mapping_.get_address()) unguard_mapping(base);
    name_ = std::move(other.name_);
    shm_ = std::move(other.shm_);
    mapping_ = std::move(other.mapping_);
    reopened_ = other.reopened_;
  }
  return *this;
}

template <typename T>
bool Region<T>::faulted() const {
  const void* base = mapping_.get_address();
  return base != nullptr && mapping_faulted(base);
}

template <typename T>
int Region<T>::open_fd(bool writable) const {
  int fd = shm_open(name_.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
  if (fd < 0) throw RegionError("shm_open(" + name_ + "): " + std::strerror(errno));
  return fd;
}

template <typename T>
void Region<T>::unlink() {
  bip::shared_memory_object::remove(name_.c_str());
}

template class Region<common::ControlRegion>;
template class Region<common::PodRegion>;

}  // namespace quanta::arbiter
