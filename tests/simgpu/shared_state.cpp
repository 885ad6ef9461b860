// Creation, attachment and recovery of the shared device model. Creation and attachment
// are serialised with flock on the segment (released by the kernel if a process dies);
// device state is guarded by robust process-shared mutexes.
#include "tests/simgpu/shared_state.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

namespace quanta::simgpu {
namespace {

void init_mutex(pthread_mutex_t* m) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(m, &attr);
  pthread_mutexattr_destroy(&attr);
}

void copy_text(char* dst, size_t cap, const std::string& src) {
  std::memset(dst, 0, cap);
  std::memcpy(dst, src.data(), std::min(cap - 1, src.size()));
}

void reset_state(SharedState* s, const Config& cfg) {
  std::memset(static_cast<void*>(s), 0, sizeof(SharedState));
  s->version = kStateVersion;
  s->size = sizeof(SharedState);
  s->device_count = static_cast<uint32_t>(cfg.devices.size());
  s->next_context_id.store(1);
  s->timeslice_ns = cfg.timeslice_ns;
  s->switch_ns = cfg.switch_ns;
  copy_text(s->log_path, sizeof s->log_path, cfg.log_path);
  for (size_t i = 0; i < cfg.devices.size(); ++i) {
    DeviceState& d = s->devices[i];
    const DeviceSpec& spec = cfg.devices[i];
    init_mutex(&d.lock);
    copy_text(d.name, sizeof d.name, spec.name);
    copy_text(d.uuid_text, sizeof d.uuid_text, spec.uuid_text);
    std::memcpy(d.uuid, spec.uuid, 16);
    std::memcpy(d.parent_uuid, spec.parent_uuid, 16);
    d.physical_index = spec.physical_index;
    d.mig_instance = spec.mig_instance;
    d.capacity = spec.memory_bytes;
    d.engine.running = -1;
    d.engine.last_ran = -1;
  }
  // Magic last: a process that finds it knows the rest is in place.
  __atomic_store_n(&s->magic, kStateMagic, __ATOMIC_RELEASE);
}

bool same_shape(const SharedState* s, const Config& cfg) {
  if (s->device_count != cfg.devices.size() || s->timeslice_ns != cfg.timeslice_ns ||
      s->switch_ns != cfg.switch_ns)
    return false;
  for (size_t i = 0; i < cfg.devices.size(); ++i) {
    const DeviceState& d = s->devices[i];
    const DeviceSpec& spec = cfg.devices[i];
    if (d.capacity != spec.memory_bytes || spec.name != d.name || spec.uuid_text != d.uuid_text)
      return false;
  }
  return true;
}

}  // namespace

bool process_alive(int32_t pid) {
  if (pid <= 0) return false;
  return kill(pid, 0) == 0 || errno != ESRCH;
}

SharedState* attach_shared_state(const Config& cfg, std::string& error) {
  const std::string name = "/" + cfg.state_name;
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    error = "simgpu: cannot open shared state " + name + ": " + std::strerror(errno);
    return nullptr;
  }
  while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  struct stat st {};
  fstat(fd, &st);
  const bool fresh = static_cast<size_t>(st.st_size) < sizeof(SharedState);
  if (fresh && ftruncate(fd, sizeof(SharedState)) != 0) {
    error = "simgpu: cannot size shared state " + name + ": " + std::strerror(errno);
    close(fd);
    return nullptr;
  }
  void* map = mmap(nullptr, sizeof(SharedState), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    error = "simgpu: cannot map shared state " + name + ": " + std::strerror(errno);
    close(fd);
    return nullptr;
  }
  auto* s = static_cast<SharedState*>(map);
  bool anyone_alive = false;
  if (!fresh && s->magic == kStateMagic && s->version == kStateVersion &&
      s->size == sizeof(SharedState)) {
    // This process counts as alive too: when libcuda and libnvidia-ml of one process both
    // attach, the second must not wipe what the first has charged.
    for (int i = 0; i < kMaxAttached; ++i) {
      if (s->attached[i] == 0) continue;
      if (s->attached[i] == getpid() || process_alive(s->attached[i]))
        anyone_alive = true;
      else
        s->attached[i] = 0;
    }
  }
  if (!anyone_alive) {
    reset_state(s, cfg);
  } else {
    // The device shape belongs to the processes already running; say so when this
    // process asked for a different one, since it will not get it.
    if (!same_shape(s, cfg)) {
      std::fprintf(
          stderr,
          "simgpu: shared state %s is in use with another device configuration "
          "(SIMGPU_DEVICES/MEMORY/NAME/UUIDS/MIG/TIMESLICE_US/SWITCH_US); using it as it is\n",
          name.c_str());
    }
    // An execution log asked for by a later process is still honoured.
    if (s->log_path[0] == '\0' && !cfg.log_path.empty())
      copy_text(s->log_path, sizeof s->log_path, cfg.log_path);
  }
  const int32_t self = getpid();
  bool registered = false;
  for (int i = 0; i < kMaxAttached && !registered; ++i) {
    if (s->attached[i] == self) registered = true;
  }
  for (int i = 0; i < kMaxAttached && !registered; ++i) {
    if (s->attached[i] == 0 || !process_alive(s->attached[i])) {
      s->attached[i] = self;
      registered = true;
    }
  }
  flock(fd, LOCK_UN);
  close(fd);
  return s;
}

void detach_shared_state(SharedState* state) {
  const int32_t self = getpid();
  for (auto& pid : state->attached) {
    if (__atomic_load_n(&pid, __ATOMIC_RELAXED) == self)
      __atomic_store_n(&pid, 0, __ATOMIC_RELAXED);
  }
}

DeviceLock::DeviceLock(DeviceState& dev) : dev_(dev) {
  int rc = pthread_mutex_lock(&dev_.lock);
  if (rc == EOWNERDEAD) {
    pthread_mutex_consistent(&dev_.lock);
    owner_died_ = true;
    reap_dead_processes(dev_);
  }
}

DeviceLock::~DeviceLock() {
  pthread_mutex_unlock(&dev_.lock);
}

ProcessUsage* find_process(DeviceState& dev, int32_t pid, bool create) {
  ProcessUsage* free_slot = nullptr;
  for (auto& p : dev.processes) {
    if (p.pid == pid) return &p;
    if (p.pid == 0 && free_slot == nullptr) free_slot = &p;
  }
  if (!create) return nullptr;
  if (free_slot == nullptr) {
    reap_dead_processes(dev);
    for (auto& p : dev.processes) {
      if (p.pid == 0) {
        free_slot = &p;
        break;
      }
    }
  }
  if (free_slot != nullptr) {
    *free_slot = ProcessUsage{};
    free_slot->pid = pid;
  }
  return free_slot;
}

namespace {

template <typename Gone>
void drop_processes(DeviceState& dev, Gone gone) {
  for (auto& p : dev.processes) {
    if (p.pid == 0 || !gone(p.pid)) continue;
    dev.used -= std::min(dev.used, p.bytes);
    p = ProcessUsage{};
  }
  for (int i = 0; i < kMaxContexts; ++i) {
    ContextSlot& c = dev.contexts[i];
    if (!c.live || !gone(c.pid)) continue;
    c.live = 0;
    c.executed = c.submitted;  // its queued work dies with it
  }
}

}  // namespace

void reap_dead_processes(DeviceState& dev) {
  drop_processes(dev, [](int32_t pid) { return !process_alive(pid); });
}

void forget_process(DeviceState& dev, int32_t pid) {
  DeviceLock lock(dev);
  drop_processes(dev, [pid](int32_t p) { return p == pid; });
}

}  // namespace quanta::simgpu

namespace quanta::simgpu {

bool reserve_device_memory(DeviceState& dev, int32_t pid, uint64_t bytes) {
  DeviceLock lock(dev);
  if (bytes > dev.capacity - std::min(dev.capacity, dev.used)) {
    reap_dead_processes(dev);
    if (bytes > dev.capacity - std::min(dev.capacity, dev.used)) return false;
  }
  ProcessUsage* p = find_process(dev, pid, true);
  if (p == nullptr) return false;
  dev.used += bytes;
  p->bytes += bytes;
  return true;
}

void release_device_memory(DeviceState& dev, int32_t pid, uint64_t bytes) {
  DeviceLock lock(dev);
  ProcessUsage* p = find_process(dev, pid, false);
  if (p == nullptr) return;  // already reclaimed
  const uint64_t amount = std::min(bytes, p->bytes);
  p->bytes -= amount;
  dev.used -= std::min(dev.used, amount);
}

}  // namespace quanta::simgpu
