// A cgroup of its own for each pod of a quanta-bench run. The arbiter tells pods apart as it
// does containers on a node: a registration names a cgroup, and a process joins the pod whose
// cgroup holds it (the line of /proc/<pid>/cgroup that common/cgroup.h picks).
#pragma once

#include <functional>
#include <map>
#include <string>

namespace quanta::bench {

struct PodCgroup {
  std::string path;   // as /proc/<pid>/cgroup shows it: what the pod's registration names
  std::string procs;  // its cgroup.procs: a process that writes "0" there moves itself in
};

class PodCgroups {
 public:
  // A directory `run_name` below the bench's own cgroup in the hierarchy the arbiter reads
  // for a process placed there: cgroup v2 where it is mounted (hybrid hosts too: a path
  // below the unified root outranks the v1 ones), else the v1 memory controller's. Throws
  // std::runtime_error saying what it tried when neither can be made (not root, read-only
  // cgroup mounts).
  explicit PodCgroups(const std::string& run_name);
  ~PodCgroups();  // removes the pods' cgroups; processes still in one go back to the bench's
  PodCgroups(const PodCgroups&) = delete;
  PodCgroups& operator=(const PodCgroups&) = delete;

  // The cgroup of pod `pod`, made at its first use; throws std::runtime_error.
  const PodCgroup& of(const std::string& pod);

  // Removes the run directories below the bench's own cgroup for which `stale(name)` is
  // true (runs of a quanta-bench that was killed), with their pods' cgroups.
  static void sweep(const std::function<bool(const std::string&)>& stale);

 private:
  std::string home_dir_;  // the bench's own cgroup directory (where strays go back)
  std::string run_dir_;   // its child for this run
  std::string run_path_;  // run_dir_ as /proc/<pid>/cgroup shows it
  std::map<std::string, PodCgroup> pods_;
};

}  // namespace quanta::bench
