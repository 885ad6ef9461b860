// The recovery scan: /proc/<pid>/maps parsing and map_files reopening on a helper thread.
#include "arbiter/state/region_recovery.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

namespace quanta::arbiter {

std::vector<MemfdMapping> memfd_mappings(const std::string& maps_text, const std::string& scope) {
  std::vector<MemfdMapping> out;
  const std::string prefix = "/memfd:" + scope + ".";
  const std::string suffix = " (deleted)";
  std::istringstream lines(maps_text);
  std::string line;
  while (std::getline(lines, line)) {
    // start-end perms offset dev inode path
    std::istringstream fields(line);
    std::string range, perms, offset, dev, inode;
    if (!(fields >> range >> perms >> offset >> dev >> inode)) continue;
    std::string path;
    std::getline(fields, path);
    const size_t at = path.find_first_not_of(' ');
    if (at == std::string::npos) continue;
    path = path.substr(at);
    if (path.rfind(prefix, 0) != 0) continue;
    if (path.size() <= prefix.size() + suffix.size() ||
        path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    if (range.find('-') == std::string::npos ||
        range.find_first_not_of("0123456789abcdef-") != std::string::npos)
      continue;
    if (inode.empty() || inode.size() > 20 ||
        inode.find_first_not_of("0123456789") != std::string::npos)
      continue;
    MemfdMapping m;
    m.range = range;
    m.inode = std::stoull(inode);
    constexpr size_t kMemfdPrefix = sizeof("/memfd:") - 1;
    m.name = path.substr(kMemfdPrefix, path.size() - kMemfdPrefix - suffix.size());
    out.push_back(std::move(m));
  }
  return out;
}

namespace {

struct Shared {
  std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;
  pid_t current = 0;  // the pid being read now
  RecoveryScan scan;
};

void scan_pid(Shared& shared, const std::string& scope, pid_t pid) {
  const std::string base = "/proc/" + std::to_string(pid);
  std::ifstream in(base + "/maps");
  if (!in) return;
  std::stringstream text;
  text << in.rdbuf();
  for (MemfdMapping& m : memfd_mappings(text.str(), scope)) {
    {
      std::lock_guard<std::mutex> lock(shared.mu);
      shared.scan.mapped_by[pid].insert(m.inode);
      if (shared.scan.regions.count(m.inode) != 0) continue;
    }
    const bool pod = m.name.find(".pod.") != std::string::npos;
    UniqueFd fd(
        ::open((base + "/map_files/" + m.range).c_str(), (pod ? O_RDWR : O_RDONLY) | O_CLOEXEC));
    std::lock_guard<std::mutex> lock(shared.mu);
    FoundRegion& found = shared.scan.regions[m.inode];
    if (found.pid != 0) continue;
    found.name = m.name;
    found.inode = m.inode;
    found.pid = pid;
    found.fd = std::move(fd);
  }
}

}  // namespace

RecoveryScan scan_tenant_mappings(const std::string& scope, const std::vector<pid_t>& pids,
                                  int deadline_ms) {
  auto shared = std::make_shared<Shared>();
  std::thread worker([shared, scope, pids] {
    for (pid_t pid : pids) {
      {
        std::lock_guard<std::mutex> lock(shared->mu);
        shared->current = pid;
      }
      scan_pid(*shared, scope, pid);
    }
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->current = 0;
    shared->done = true;
    shared->done_cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(shared->mu);
  const bool finished = shared->done_cv.wait_for(lock, std::chrono::milliseconds(deadline_ms),
                                                 [&] { return shared->done; });
  RecoveryScan out = std::move(shared->scan);
  shared->scan = RecoveryScan();
  if (!finished) {
    // The worker is stuck in the kernel on one process's maps; leave it to finish alone
    // (it only touches `shared`, which it keeps alive).
    bool past = false;
    for (pid_t pid : pids) {
      past = past || pid == shared->current;
      if (past) out.unanswered.push_back(pid);
    }
    lock.unlock();
    worker.detach();
  } else {
    lock.unlock();
    worker.join();
  }
  return out;
}

FoundRegion* recorded_region(RecoveryScan& scan, uint64_t inode, const std::string& name) {
  auto it = inode == 0 ? scan.regions.end() : scan.regions.find(inode);
  if (it == scan.regions.end() || it->second.name != name || !it->second.fd) return nullptr;
  return &it->second;
}

EntryFate entry_fate(const EntryFacts& facts) {
  if (facts.recorded && facts.unanswered) return EntryFate::kKeepCounted;
  const bool genuine = facts.recorded && facts.alive && !facts.adopted_already && facts.maps_region;
  return genuine ? EntryFate::kAdopt : EntryFate::kReclaim;
}

std::map<uint32_t, uint32_t> slots_by_owner(const common::ControlRegion& previous) {
  std::map<uint32_t, uint32_t> by_owner;
  for (uint32_t s = 0; s < common::kMaxSlotsPerGpu; ++s) {
    const uint32_t owner = previous.slots[s].owner.load();
    if (owner != 0) by_owner.emplace(owner, s);
  }
  return by_owner;
}

}  // namespace quanta::arbiter
