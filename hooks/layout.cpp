// The layout's paths and the settings files' text (key = value lines, '#' comments, read by
// libquanta.so).
#include "hooks/layout.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "hooks/error.h"

namespace quanta::hooks {

std::string Layout::host_socket_dir() const {
  const size_t slash = host_socket.rfind('/');
  return slash == 0 ? "/" : host_socket.substr(0, slash);
}

std::string Layout::container_socket() const {
  return std::string(kContainerSocketDir) + host_socket.substr(host_socket.rfind('/'));
}

std::vector<QuantaMount> quanta_mounts(const Layout& layout) {
  const std::vector<std::string> file_options = {"ro", "nosuid", "nodev", "bind"};
  return {
      {layout.library(), kContainerLibrary, false, file_options},
      {layout.preload(), kContainerPreload, false, file_options},
      {layout.etc(), kContainerEtc, true, {"ro", "nosuid", "nodev", "noexec", "bind"}},
      {layout.host_socket_dir(), kContainerSocketDir, true,
       {"ro", "nosuid", "nodev", "noexec", "bind"}},
  };
}

std::string node_conf_text(const config::NodeConfig& config, const Layout& layout) {
  std::string text =
      "# Quanta's node-wide settings for libquanta.so, written by `quanta-hook cdi generate`\n"
      "# from " +
      (config.source.empty() ? std::string("the built-in defaults") : config.source) +
      "; mounted read-only at " + kContainerNodeConf + ".\n";
  text += std::string("enforce = ") + (config.enforce.enforce ? "on" : "off") + "\n";
  text += std::string("unplaced = ") + config::unplaced_name(config.enforce.unplaced) + "\n";
  text += "socket = " + layout.container_socket() + "\n";
  return text;
}

std::string preload_text() {
  return std::string(kContainerLibrary) + "\n";
}

std::string container_conf_placeholder_text() {
  return std::string("# Placeholder: quanta-hook mounts each container's own settings over this file\n"
                     "# at its creation. A container that reads this one was not registered by it.\n");
}

bool unplaced_closed(const config::NodeConfig& config, bool capped) {
  switch (config.enforce.unplaced) {
    case config::UnplacedAction::kOpen:
      return false;
    case config::UnplacedAction::kClosed:
      return true;
    case config::UnplacedAction::kClosedIfCapped:
      return capped;
  }
  return true;
}

std::string container_conf_text(const std::string& container_id, const std::string& pod_key,
                                bool capped, bool closed) {
  return "# Quanta's settings for container " + container_id +
         ", written by quanta-hook at its creation;\n# mounted read-only at " + kContainerConf +
         ".\npod = " + pod_key + "\nmemory_limit = " + (capped ? "1" : "0") +
         "\nunplaced = " + (closed ? "closed" : "open") + "\n";
}

void write_file_atomically(const std::string& path, const std::string& text, unsigned mode) {
  const std::filesystem::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path(), ec);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) throw HookError("cannot write " + tmp + ": " + std::strerror(errno));
  size_t off = 0;
  bool ok = true;
  while (ok && off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) off += static_cast<size_t>(n);
  }
  const int saved = errno;
  ok = ok && fchmod(fd, mode) == 0 && fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = ok ? errno : saved;
    ::unlink(tmp.c_str());
    throw HookError("cannot write " + path + ": " + std::strerror(err));
  }
}

}  // namespace quanta::hooks
