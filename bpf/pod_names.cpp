// Pod names from what the kubelet puts in every container: /etc/hostname holds the pod's
// name (when the container has its own UTS namespace) and the service-account mount its
// namespace; the cgroup path holds the pod UID (cgroupfs: pod<uid>, systemd:
// pod<uid with _ for ->.slice).
#include "bpf/pod_names.h"

#include <sys/stat.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "bpf/node_scan.h"

namespace quanta::bpf {
namespace {

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool same_uts_namespace(pid_t pid) {
  struct stat mine {
  }, theirs{};
  if (::stat("/proc/self/ns/uts", &mine) != 0) return true;
  if (::stat(("/proc/" + std::to_string(pid) + "/ns/uts").c_str(), &theirs) != 0) return true;
  return mine.st_ino == theirs.st_ino && mine.st_dev == theirs.st_dev;
}

std::string env_value(pid_t pid, const std::string& key) {
  const std::string environ = slurp("/proc/" + std::to_string(pid) + "/environ");
  const std::string prefix = key + "=";
  size_t at = 0;
  while (at < environ.size()) {
    const size_t end = environ.find('\0', at);
    const std::string entry =
        environ.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (entry.rfind(prefix, 0) == 0) return entry.substr(prefix.size());
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return {};
}

}  // namespace

std::string pod_uid_from_cgroup(const std::string& cgroup_text) {
  static const std::regex pod_uid(
      "kubepods[^\\n]*?pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_]"
      "[0-9a-fA-F]{12})");
  std::smatch match;
  if (!std::regex_search(cgroup_text, match, pod_uid)) return {};
  std::string uid = match[1];
  for (char& c : uid) {
    if (c == '_') c = '-';
  }
  return uid;
}

PodName pod_of_process(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  const std::string uid = pod_uid_from_cgroup(slurp(proc + "/cgroup"));
  if (!uid.empty()) {
    const std::string ns =
        first_line(proc + "/root/var/run/secrets/kubernetes.io/serviceaccount/namespace");
    const std::string name =
        same_uts_namespace(pid) ? std::string() : first_line(proc + "/root/etc/hostname");
    if (!ns.empty() && !name.empty()) return {ns + "/" + name, "kubernetes"};
    return {"uid:" + uid, "cgroup"};
  }
  const std::string named = env_value(pid, "QUANTA_POD");
  if (!named.empty()) return {named, "environment"};
  const std::string comm = process_comm(pid);
  return {"pid " + std::to_string(pid) + (comm.empty() ? "" : " (" + comm + ")"), "process"};
}

}  // namespace quanta::bpf
