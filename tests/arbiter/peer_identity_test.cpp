// Who is on the other end of a tenant or admin connection: a live caller is held by a pidfd,
// and when none can be had the reason names what an operator must fix, not a caller that
// never left.
#include "arbiter/serving/peer_identity.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>

namespace quanta::arbiter {
namespace {

class SocketPair {
 public:
  SocketPair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_), 0); }
  ~SocketPair() {
    close(fds_[0]);
    close(fds_[1]);
  }
  int server() const { return fds_[0]; }

 private:
  int fds_[2] = {-1, -1};
};

TEST(PeerIdentity, ALiveCallerIsHeldByAPidfd) {
  SocketPair pair;
  for (bool allow_peer_pidfd : {false, true}) {
    PeerIdentity peer;
    std::string why;
    ASSERT_TRUE(identify_peer(pair.server(), allow_peer_pidfd, &peer, &why)) << why;
    EXPECT_EQ(peer.pid, getpid());
    EXPECT_EQ(peer.uid, getuid());
    EXPECT_TRUE(peer_alive(peer));
  }
}

// The lowest descriptor number free now: a limit one above it leaves exactly one to open.
int lowest_free_descriptor() {
  const int fd = dup(STDIN_FILENO);
  close(fd);
  return fd;
}

// Out of descriptors, the arbiter cannot hold the caller (its pidfd, or the /proc file read
// beside it): it says so, so that the refusal an operator's quantactl prints points at the
// arbiter's limit and not at the operator's own process "having exited".
TEST(PeerIdentity, NoDescriptorLeftIsSaidAsSuchAndNotAsACallerThatExited) {
  SocketPair pair;
  rlimit old_limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old_limit), 0);
  for (int left : {0, 1}) {
    for (bool allow_peer_pidfd : {false, true}) {
      PeerIdentity peer;
      std::string why;
      rlimit tight = old_limit;
      tight.rlim_cur = static_cast<rlim_t>(left == 0 ? 0 : lowest_free_descriptor() + 1);
      ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
      const bool identified = identify_peer(pair.server(), allow_peer_pidfd, &peer, &why);
      ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old_limit), 0);
      SCOPED_TRACE(std::to_string(left) + " descriptor(s) left, peer pidfd " +
                   (allow_peer_pidfd ? "allowed" : "not used"));
      EXPECT_FALSE(identified);
      EXPECT_NE(why.find("out of file descriptors"), std::string::npos) << why;
      EXPECT_EQ(why.find("exited"), std::string::npos) << why;
    }
  }
}

// A caller that has left is told apart from a shortage: the reason says it exited.
TEST(PeerIdentity, ACallerThatLeftIsSaidToHaveExited) {
  const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string name = "quanta-peer-identity-" + std::to_string(getpid());
  std::memcpy(address.sun_path + 1, name.data(), name.size());  // abstract: no file left
  const socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    _exit(connect(fd, reinterpret_cast<sockaddr*>(&address), length) == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const int accepted = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(accepted, 0);
  for (bool allow_peer_pidfd : {false, true}) {
    PeerIdentity peer;
    std::string why;
    EXPECT_FALSE(identify_peer(accepted, allow_peer_pidfd, &peer, &why));
    EXPECT_NE(why.find("exited"), std::string::npos) << why;
  }
  close(accepted);
  close(listener);
}

}  // namespace
}  // namespace quanta::arbiter
