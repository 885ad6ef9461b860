// Admin-socket discovery and the status request. The socket path can be longer than
// sun_path allows once prefixed with /proc/<pid>/root, so it is opened with O_PATH and
// connected to as /proc/self/fd/<n>.
#include "bpf/arbiter_client.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "bpf/trace_run.h"
#include "hosted/admin_client.h"
#include "hosted/unique_fd.h"

namespace quanta::bpf {
namespace {

constexpr uint64_t kStatusTimeoutNs = 3'000'000'000;  // the whole exchange

std::set<uint64_t> socket_inodes(pid_t pid) {
  std::set<uint64_t> inodes;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* fds = ::opendir(dir.c_str());
  if (!fds) return inodes;
  while (dirent* entry = ::readdir(fds)) {
    char target[128];
    const ssize_t n = ::readlink((dir + "/" + entry->d_name).c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    unsigned long long inode = 0;
    if (std::sscanf(target, "socket:[%llu]", &inode) == 1) inodes.insert(inode);
  }
  ::closedir(fds);
  return inodes;
}

}  // namespace

std::optional<std::string> find_admin_socket(pid_t pid) {
  const std::set<uint64_t> mine = socket_inodes(pid);
  std::ifstream table("/proc/" + std::to_string(pid) + "/net/unix");
  std::string line;
  std::getline(table, line);  // header
  while (std::getline(table, line)) {
    // Num RefCount Protocol Flags Type St Inode Path
    std::istringstream fields(line);
    std::string num, refs, protocol, flags, type, state, path;
    uint64_t inode = 0;
    fields >> num >> refs >> protocol >> flags >> type >> state >> inode >> path;
    const bool listening = std::strtoul(flags.c_str(), nullptr, 16) & 0x10000u;  // __SO_ACCEPTCON
    if (listening && type == "0001" && !path.empty() && path[0] == '/' && mine.count(inode))
      return path;
  }
  return std::nullopt;
}

std::optional<nlohmann::json> query_status(pid_t pid, const std::string& socket_path,
                                           std::string* error) {
  const std::string through = "/proc/" + std::to_string(pid) + "/root" + socket_path;
  const hosted::UniqueFd path_fd(::open(through.c_str(), O_PATH | O_CLOEXEC));
  if (path_fd.get() < 0) {
    *error = "cannot open admin socket " + through + ": " + errno_text(errno);
    return std::nullopt;
  }
  // The socket is reached through the descriptor, so a path that only resolves in the
  // arbiter's mount namespace still names the same socket.
  const std::string through_fd = "/proc/self/fd/" + std::to_string(path_fd.get());
  const hosted::AdminReply reply = hosted::admin_request(
      through_fd, {{"cmd", "status"}}, kStatusTimeoutNs, hosted::kStatusAnswerBytes);
  switch (reply.outcome) {
    case hosted::AdminOutcome::kAnswered:
      return reply.response;
    case hosted::AdminOutcome::kRefused:
      *error = "arbiter " + std::to_string(pid) + " answered status with: " +
               reply.response.dump().substr(0, 200);
      return std::nullopt;
    case hosted::AdminOutcome::kUnreachable:
      break;
  }
  *error = "arbiter " + std::to_string(pid) + " (admin socket " + socket_path +
           "): " + reply.reason;
  return std::nullopt;
}

}  // namespace quanta::bpf
