// The arbiter's tenant socket spoken directly (no shim, nothing preloaded), so these run
// in the sanitizer pass too and exercise quanta-arbiter under ASan: admission with both
// regions, refusal of unregistered callers, and malformed messages that must not hurt it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "common/version.h"
#include "common/wire.h"
#include "tests/integration/harness.h"

namespace quanta::integration {
namespace {

// A tenant connection without the shim: one message out, one message and its fds back.
class RawClient {
 public:
  explicit RawClient(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof address.sun_path, "%s", path.c_str());
    connected_ = connect(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0;
    timeval timeout{5, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  }
  ~RawClient() {
    for (int fd : fds) close(fd);
    if (fd_ >= 0) close(fd_);
  }
  bool connected() const { return connected_; }
  bool send_bytes(const void* data, size_t size) { return send(fd_, data, size, MSG_NOSIGNAL) == static_cast<ssize_t>(size); }

  // Receives one message; returns its size (0 on end of stream, -1 on error).
  ssize_t receive(void* buffer, size_t capacity) {
    for (int fd : fds) close(fd);
    fds.clear();
    iovec iov{buffer, capacity};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    msghdr message{};
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    const ssize_t n = recvmsg(fd_, &message, MSG_CMSG_CLOEXEC);
    for (cmsghdr* c = CMSG_FIRSTHDR(&message); c; c = CMSG_NXTHDR(&message, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        fds.push_back(fd);
      }
    }
    return n;
  }

  std::vector<int> fds;

 private:
  int fd_ = -1;
  bool connected_ = false;
};

common::HelloMessage hello(const char* pod) {
  common::HelloMessage message{};
  message.header = common::make_header<common::HelloMessage>(common::MessageType::kHello);
  std::snprintf(message.claimed_pod, sizeof message.claimed_pod, "%s", pod);
  return message;
}

template <typename Region>
const Region* map_fd(int fd, int prot) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(Region)) return nullptr;
  void* address = mmap(nullptr, sizeof(Region), prot, MAP_SHARED, fd, 0);
  return address == MAP_FAILED ? nullptr : static_cast<const Region*>(address);
}

union AnyReply {
  common::MessageHeader header;
  common::WelcomeMessage welcome;
  common::RefusedMessage refused;
  common::AttachedMessage attached;
  common::AttachFailedMessage attach_failed;
  char bytes[1024];
};

TEST(Integration, ArbiterAdmitsARawClientWithItsRegions) {
  World world(test_name(), ArbiterConfig{.pods = {{"raw", 2, "1Gi"}}});
  world.start_arbiter();
  RawClient client(world.tenant_socket());
  ASSERT_TRUE(client.connected());
  const auto message = hello("raw");
  ASSERT_TRUE(client.send_bytes(&message, sizeof message));
  AnyReply reply{};
  ASSERT_EQ(client.receive(&reply, sizeof reply), static_cast<ssize_t>(sizeof(common::WelcomeMessage)))
      << "errno " << errno << "; the arbiter's log:\n" << world.arbiter_log();
  ASSERT_EQ(reply.header.type, common::MessageType::kWelcome);
  ASSERT_EQ(client.fds.size(), 2u) << "welcome must carry the pod region and the doorbell";
  const auto* pod = map_fd<common::PodRegion>(client.fds[0], PROT_READ | PROT_WRITE);
  ASSERT_NE(pod, nullptr);
  EXPECT_EQ(pod->header.magic, common::kPodMagic);
  EXPECT_EQ(pod->header.version, common::kLayoutVersion);
  EXPECT_EQ(pod->procs[reply.welcome.proc_index].pid.load(), static_cast<uint32_t>(getpid()));
  const uint64_t one = 1;
  EXPECT_EQ(write(client.fds[1], &one, sizeof one), static_cast<ssize_t>(sizeof one)) << "the doorbell is no eventfd";
  const uint32_t proc_index = reply.welcome.proc_index;

  // Attach GPU 0 by the UUID its control region names.
  ControlView control(world, 0);
  ASSERT_TRUE(control.ok());
  common::AttachMessage attach{};
  attach.header = common::make_header<common::AttachMessage>(common::MessageType::kAttach);
  std::memcpy(attach.uuid, control->header.uuid, sizeof attach.uuid);
  ASSERT_TRUE(client.send_bytes(&attach, sizeof attach));
  ASSERT_EQ(client.receive(&reply, sizeof reply), static_cast<ssize_t>(sizeof(common::AttachedMessage)));
  ASSERT_EQ(reply.header.type, common::MessageType::kAttached) << reply.attach_failed.reason;
  ASSERT_EQ(client.fds.size(), 1u);
  ASSERT_LT(reply.attached.slot, common::kMaxSlotsPerGpu);
  const auto* mapped = map_fd<common::ControlRegion>(client.fds[0], PROT_READ);
  ASSERT_NE(mapped, nullptr);
  EXPECT_EQ(mapped->header.magic, common::kControlMagic);
  // The slot carries an owner word the reply told this process, and nothing about it; the
  // cap and the slot number are in the pod's own region.
  EXPECT_NE(reply.attached.owner, 0u);
  EXPECT_EQ(mapped->slots[reply.attached.slot].owner.load(), reply.attached.owner);
  EXPECT_EQ(pod->memory_cap[0].load(), 1ull << 30);
  EXPECT_EQ(pod->procs[proc_index].limits[0].slot.load(), reply.attached.slot);
  munmap(const_cast<common::PodRegion*>(pod), sizeof(common::PodRegion));
  // The control region is the tenant's to read, never to write.
  EXPECT_EQ(mmap(nullptr, sizeof(common::ControlRegion), PROT_READ | PROT_WRITE, MAP_SHARED, client.fds[0], 0),
            MAP_FAILED);
  munmap(const_cast<common::ControlRegion*>(mapped), sizeof(common::ControlRegion));
}

TEST(Integration, APodThePreviousReleaseDidNotPlaceIsNeverServedInItsLayout) {
  // Layout 2 (common/shm_layout_2.h) shows each slot's pid, pod and cap to the other
  // layout-2 processes of a GPU. Only pods the previous release placed, re-adopted at the
  // arbiter's start (tests/upgrade), get it: a process that speaks that release's protocol
  // for a new pod is refused in that protocol, given no region, and counted.
  World world(test_name(), ArbiterConfig{.pods = {{"chooser", 2, "1Gi"}}});
  world.start_arbiter();
  RawClient client(world.tenant_socket());
  ASSERT_TRUE(client.connected());
  auto message = hello("chooser");
  message.header.version = 3;
  ASSERT_TRUE(client.send_bytes(&message, sizeof message));
  AnyReply reply{};
  ASSERT_EQ(client.receive(&reply, sizeof reply), static_cast<ssize_t>(sizeof(common::RefusedMessage)));
  EXPECT_EQ(reply.header.version, 3u) << "a protocol-3 shim is answered in protocol 3";
  ASSERT_EQ(reply.header.type, common::MessageType::kRefused);
  EXPECT_TRUE(client.fds.empty()) << "no region of layout 2 for a pod it was not made for";
  const std::string reason(reply.refused.reason, strnlen(reply.refused.reason, sizeof reply.refused.reason));
  EXPECT_NE(reason.find("pod chooser was not placed by the previous release"), std::string::npos) << reason;
  EXPECT_NE(reason.find("restart the pod"), std::string::npos) << reason;
  EXPECT_EQ(open_arbiter_region(world, world.scope() + ".gpu.0", O_RDONLY, 2), -1)
      << "the arbiter made a control region of layout 2";
  EXPECT_TRUE(eventually(5, [&] {
    return world.arbiter_log().find("refusing pid " + std::to_string(getpid())) != std::string::npos;
  })) << world.arbiter_log();
  // The same pod in this release's protocol is served in this release's layout.
  RawClient current(world.tenant_socket());
  const auto now = hello("chooser");
  ASSERT_TRUE(current.send_bytes(&now, sizeof now));
  ASSERT_EQ(current.receive(&reply, sizeof reply), static_cast<ssize_t>(sizeof(common::WelcomeMessage)));
  ASSERT_EQ(reply.header.type, common::MessageType::kWelcome) << reply.refused.reason;
  ASSERT_EQ(current.fds.size(), 2u);
  struct stat st {};
  ASSERT_EQ(fstat(current.fds[0], &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), sizeof(common::PodRegion));
}

TEST(Integration, ArbiterRefusesUnregisteredRawClientWithAReason) {
  World world(test_name(), ArbiterConfig{.allow_unregistered = false, .pods = {}});
  world.start_arbiter();
  RawClient client(world.tenant_socket());
  ASSERT_TRUE(client.connected());
  const auto message = hello("stranger");
  ASSERT_TRUE(client.send_bytes(&message, sizeof message));
  AnyReply reply{};
  ASSERT_EQ(client.receive(&reply, sizeof reply), static_cast<ssize_t>(sizeof(common::RefusedMessage)));
  EXPECT_EQ(reply.header.type, common::MessageType::kRefused);
  EXPECT_TRUE(client.fds.empty()) << "a refused caller must receive no region";
  EXPECT_GT(strnlen(reply.refused.reason, sizeof reply.refused.reason), 10u) << "the refusal gives no reason";
}

TEST(Integration, ArbiterRefusesAShimOfAnotherProtocolNamingBothVersions) {
  // A pod started under a release whose shim speaks a tenant protocol older than any this
  // arbiter accepts: its Hello is answered with a Refused saying both versions and what to
  // do, and the arbiter logs it.
  World world(test_name(), ArbiterConfig{.pods = {{"old", 1, ""}}});
  world.start_arbiter();
  RawClient client(world.tenant_socket());
  ASSERT_TRUE(client.connected());
  auto message = hello("old");
  message.header.version = common::kTenantProtocol.oldest - 1;
  ASSERT_TRUE(client.send_bytes(&message, sizeof message));
  AnyReply reply{};
  ASSERT_EQ(client.receive(&reply, sizeof reply), static_cast<ssize_t>(sizeof(common::RefusedMessage)));
  EXPECT_EQ(reply.header.version, common::kWireVersion) << "the reply is in the arbiter's own protocol";
  ASSERT_EQ(reply.header.type, common::MessageType::kRefused);
  EXPECT_TRUE(client.fds.empty());
  const std::string reason(reply.refused.reason, strnlen(reply.refused.reason, sizeof reply.refused.reason));
  const std::string old_version = "tenant protocol " + std::to_string(common::kTenantProtocol.oldest - 1);
  EXPECT_NE(reason.find(old_version), std::string::npos) << reason;
  EXPECT_NE(reason.find("speaks " + std::to_string(common::kWireVersion)), std::string::npos) << reason;
  EXPECT_NE(reason.find("restart the pod"), std::string::npos) << reason;
  EXPECT_TRUE(eventually(5, [&] {
    const std::string log = world.arbiter_log();
    return log.find("refusing pid " + std::to_string(getpid())) != std::string::npos &&
           log.find(old_version) != std::string::npos;
  })) << world.arbiter_log();
  // The arbiter serves its own protocol as before.
  RawClient current(world.tenant_socket());
  const auto fresh = hello("old");
  ASSERT_TRUE(current.send_bytes(&fresh, sizeof fresh));
  AnyReply welcome{};
  ASSERT_GT(current.receive(&welcome, sizeof welcome), 0);
  EXPECT_EQ(welcome.header.type, common::MessageType::kWelcome) << welcome.refused.reason;
}

TEST(Integration, ArbiterSurvivesMalformedTenantMessages) {
  World world(test_name(), ArbiterConfig{.pods = {{"raw", 1, ""}}});
  world.start_arbiter();
  {
    RawClient garbage(world.tenant_socket());
    const char junk[] = "not a quanta message at all";
    garbage.send_bytes(junk, sizeof junk);
  }
  {
    RawClient short_message(world.tenant_socket());
    const uint32_t two = 2;
    short_message.send_bytes(&two, sizeof two);
  }
  {
    RawClient wrong_size(world.tenant_socket());
    auto message = hello("raw");
    message.header.size = 12345;
    wrong_size.send_bytes(&message, sizeof message);
    AnyReply reply{};
    wrong_size.receive(&reply, sizeof reply);  // refusal or closed: either is fine
  }
  {
    RawClient attach_first(world.tenant_socket());
    common::AttachMessage attach{};
    attach.header = common::make_header<common::AttachMessage>(common::MessageType::kAttach);
    std::memset(attach.uuid, 'x', sizeof attach.uuid);  // not NUL-terminated either
    attach_first.send_bytes(&attach, sizeof attach);
    AnyReply reply{};
    attach_first.receive(&reply, sizeof reply);
  }
  sleep_ms(100);
  ASSERT_TRUE(world.arbiter().running()) << "the arbiter died on malformed input (exit " << world.arbiter().exit_code()
                                         << "); its log:\n" << world.arbiter_log();
  RawClient client(world.tenant_socket());
  const auto message = hello("raw");
  ASSERT_TRUE(client.send_bytes(&message, sizeof message));
  AnyReply reply{};
  ASSERT_GT(client.receive(&reply, sizeof reply), 0);
  EXPECT_EQ(reply.header.type, common::MessageType::kWelcome) << "a proper client after the garbage was not admitted";
}

}  // namespace
}  // namespace quanta::integration
