// The arbiter's tenant socket spoken directly (no shim, nothing preloaded), so these run
// in the sanitizer pass too and exercise quanta-arbiter under ASan: admission with both
// regions, refusal of unregistered callers, and malformed messages that must not hurt it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "common/shm_layout_2.h"
#include "common/version.h"
#include "common/wire.h"
#include "harness.h"

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
  ASSERT_EQ(client.receive(&reply, sizeof reply), static_cast<ssize_t>(sizeof(common::WelcomeMessage)));
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

TEST(Integration, AShimOfThePreviousLayoutGetsRegionsOfThatLayoutAndNoneOfTheNewOnes) {
  // A pod started under the previous release: its shim speaks tenant protocol 3 and maps
  // shared-memory layout 2 (common/shm_layout_2.h). The arbiter answers in protocol 3 with
  // regions of that layout, where its control slot names it and carries its pod's cap, in
  // a control region of its own that no process of the current layout is given.
  World world(test_name(), ArbiterConfig{.pods = {{"old", 2, "1Gi"}, {"new", 1, ""}}});
  world.start_arbiter();
  RawClient client(world.tenant_socket());
  ASSERT_TRUE(client.connected());
  auto message = hello("old");
  message.header.version = 3;
  ASSERT_TRUE(client.send_bytes(&message, sizeof message));
  AnyReply reply{};
  ASSERT_EQ(client.receive(&reply, sizeof reply), static_cast<ssize_t>(sizeof(common::WelcomeMessage)));
  ASSERT_EQ(reply.header.type, common::MessageType::kWelcome) << reply.refused.reason;
  EXPECT_EQ(reply.header.version, 3u) << "a protocol-3 shim is answered in protocol 3";
  ASSERT_EQ(client.fds.size(), 2u);
  struct stat st {};
  ASSERT_EQ(fstat(client.fds[0], &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), sizeof(common::layout2::PodRegion));
  const auto* pod = map_fd<common::layout2::PodRegion>(client.fds[0], PROT_READ | PROT_WRITE);
  ASSERT_NE(pod, nullptr);
  EXPECT_EQ(pod->header.version, 2u);
  const uint32_t proc_index = reply.welcome.proc_index;
  EXPECT_EQ(pod->procs[proc_index].pid.load(), static_cast<uint32_t>(getpid()));

  ControlView control(world, 0);
  ASSERT_TRUE(control.ok());
  common::AttachMessage attach{};
  attach.header = common::make_header<common::AttachMessage>(common::MessageType::kAttach);
  attach.header.version = 3;
  std::memcpy(attach.uuid, control->header.uuid, sizeof attach.uuid);
  ASSERT_TRUE(client.send_bytes(&attach, sizeof attach));
  ASSERT_EQ(client.receive(&reply, sizeof reply), static_cast<ssize_t>(sizeof(common::AttachedMessage)));
  ASSERT_EQ(reply.header.type, common::MessageType::kAttached) << reply.attach_failed.reason;
  EXPECT_EQ(reply.header.version, 3u);
  ASSERT_EQ(client.fds.size(), 1u);
  const uint32_t slot = reply.attached.slot;
  ASSERT_LT(slot, common::kMaxSlotsPerGpu);
  const auto* mapped = map_fd<common::layout2::ControlRegion>(client.fds[0], PROT_READ);
  ASSERT_NE(mapped, nullptr);
  EXPECT_EQ(mapped->header.version, 2u);
  EXPECT_STREQ(mapped->header.uuid, control->header.uuid);
  EXPECT_EQ(mapped->slots[slot].pid.load(), static_cast<uint32_t>(getpid()));
  EXPECT_EQ(mapped->slots[slot].proc_index.load(), proc_index);
  EXPECT_EQ(mapped->slots[slot].memory_cap.load(), 1ull << 30);
  EXPECT_GT(mapped->slots[slot].quantum_ns.load(), 0u);
  EXPECT_EQ(control->slots[slot].owner.load(), 0u) << "the slot is not in the current layout's region";
  struct stat mine {}, current {};
  ASSERT_EQ(fstat(client.fds[0], &mine), 0);
  const int current_fd = open_arbiter_region(world, world.scope() + ".gpu.0", O_RDONLY, common::kLayoutVersion);
  ASSERT_GE(current_fd, 0);
  ASSERT_EQ(fstat(current_fd, &current), 0);
  close(current_fd);
  EXPECT_NE(mine.st_ino, current.st_ino) << "layout-2 slots live in a control region of their own";
  // The heartbeat reaches that region too, so the shim's lease holds.
  const uint64_t beat = mapped->header.heartbeat_ns.load();
  EXPECT_TRUE(eventually(5, [&] { return mapped->header.heartbeat_ns.load() > beat; }));

  // A process of the current release in the same pod is refused, naming both layouts; one of
  // another pod gets the current layout.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (const char* key : {"old", "new"}) {
      RawClient other(world.tenant_socket());
      auto h = hello(key);
      AnyReply r{};
      other.send_bytes(&h, sizeof h);
      other.receive(&r, sizeof r);
      std::string line = std::to_string(static_cast<uint32_t>(r.header.type)) + " " +
                         std::string(r.refused.reason, strnlen(r.refused.reason, sizeof r.refused.reason)) + "\n";
      if (r.header.type == common::MessageType::kWelcome) {
        struct stat pst {};
        fstat(other.fds.empty() ? -1 : other.fds[0], &pst);
        line = "welcome " + std::to_string(pst.st_size) + "\n";
      }
      if (write(pipe_fds[1], line.data(), line.size()) < 0) _exit(2);
    }
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_NE(out.find("3 pod old's other processes map shared-memory layout 2, this process's "
                     "libquanta.so 3"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("welcome " + std::to_string(sizeof(common::PodRegion))), std::string::npos) << out;
  munmap(const_cast<common::layout2::PodRegion*>(pod), sizeof(common::layout2::PodRegion));
  munmap(const_cast<common::layout2::ControlRegion*>(mapped), sizeof(common::layout2::ControlRegion));
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
