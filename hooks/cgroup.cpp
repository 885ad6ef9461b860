// Reading /proc/<pid>/cgroup and refusing paths that would match more than the container.
#include "hooks/cgroup.h"

#include <fstream>
#include <sstream>

#include "common/cgroup.h"
#include "hooks/error.h"

namespace quanta::hooks {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string container_cgroup_from(const std::string& container, const std::string& runtime,
                                  pid_t container_pid) {
  const std::string where = "/proc/" + std::to_string(container_pid) + "/cgroup";
  const std::string path(common::container_cgroup_path(container));
  if (path.empty())
    throw HookError("cannot tell the container's cgroup: " + where + " has no cgroup line");
  if (path == "/")
    throw HookError("the container's cgroup is the root (" + where +
                    "): its processes could not be told from any other; give the container a "
                    "cgroup of its own (linux.cgroupsPath)");
  if (path == common::container_cgroup_path(runtime))
    throw HookError("the container's cgroup " + path +
                    " is the container runtime's own: its processes could not be told from the "
                    "runtime's; on a hybrid cgroup host use a runtime that puts containers in a "
                    "cgroup of their own");
  return path;
}

std::string container_cgroup(pid_t container_pid) {
  if (container_pid <= 0)
    throw HookError("the OCI state has no pid: quanta-hook oci create-runtime must run as a "
                    "createRuntime hook, where the state names the container's host pid");
  const std::string where = "/proc/" + std::to_string(container_pid) + "/cgroup";
  const std::string text = read_text(where);
  if (text.empty()) throw HookError("cannot read " + where + " (the container's init)");
  return container_cgroup_from(text, read_text("/proc/self/cgroup"), container_pid);
}

}  // namespace quanta::hooks
