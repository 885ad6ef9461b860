// Admin-socket discovery and the status request. The socket path can be longer than
// sun_path allows once prefixed with /proc/<pid>/root, so it is opened with O_PATH and
// connected to as /proc/self/fd/<n>.
#include "arbiter_client.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "hosted/unique_fd.h"
#include "trace_run.h"

namespace quanta::bpf {
namespace {

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
  const hosted::UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof address.sun_path, "/proc/self/fd/%d", path_fd.get());
  if (sock.get() < 0 ||
      ::connect(sock.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    *error = "cannot connect to admin socket " + socket_path + " of arbiter " +
             std::to_string(pid) + ": " + errno_text(errno);
    return std::nullopt;
  }
  const std::string request = "{\"cmd\":\"status\"}\n";
  if (::send(sock.get(), request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    *error = "cannot send to admin socket " + socket_path + ": " + errno_text(errno);
    return std::nullopt;
  }
  std::string reply;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (reply.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{sock.get(), POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      *error = "arbiter " + std::to_string(pid) + " did not answer status within 3 s";
      return std::nullopt;
    }
    char buf[65536];
    const ssize_t n = ::read(sock.get(), buf, sizeof buf);
    if (n <= 0) {
      *error = "arbiter " + std::to_string(pid) + " closed the admin socket";
      return std::nullopt;
    }
    reply.append(buf, static_cast<size_t>(n));
  }
  auto status = nlohmann::json::parse(reply.substr(0, reply.find('\n')), nullptr, false);
  if (!status.is_object() || !status.value("ok", false)) {
    *error = "arbiter " + std::to_string(pid) + " answered status with: " + reply.substr(0, 200);
    return std::nullopt;
  }
  return status;
}

}  // namespace quanta::bpf
