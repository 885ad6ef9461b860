// The one admin-socket client against a socket the test answers itself: an answer as long
// as the caller allows is read whole (a large node's `status` runs to megabytes), a longer
// one is refused naming the limit, a silent arbiter costs the deadline and no more, and a
// refused connect keeps its errno for the caller's advice.
#include "hosted/admin_client.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "hosted/unique_fd.h"
#include "tests/support/temp_dir.h"

namespace quanta::hosted {
namespace {

// How the fake arbiter treats its one connection: it answers once the request line has
// arrived and holds the connection open, or it answers at once and closes without reading
// (as the arbiter refuses a caller it will not serve).
enum class Answers { kAfterTheRequest, kAtOnceAndCloses };

// A listening socket whose one connection is answered with `answer` (nothing when empty).
class FakeAdminSocket {
 public:
  FakeAdminSocket(const std::string& path, std::string answer,
                  Answers answers = Answers::kAfterTheRequest)
      : answer_(std::move(answer)), answers_(answers) {
    listener_ = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
    EXPECT_EQ(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(::listen(listener_.get(), 1), 0);
    server_ = std::thread([this] { serve(); });
  }
  ~FakeAdminSocket() {
    ::shutdown(listener_.get(), SHUT_RDWR);
    server_.join();
  }

 private:
  void serve() {
    UniqueFd peer(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!peer) return;
    std::string request;
    char c = 0;
    if (answers_ == Answers::kAfterTheRequest)
      while (::read(peer.get(), &c, 1) == 1 && c != '\n') request += c;
    for (size_t sent = 0; sent < answer_.size();) {
      const ssize_t n =
          ::send(peer.get(), answer_.data() + sent, answer_.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
    if (answers_ == Answers::kAtOnceAndCloses) return;
    // Held open: the client decides when it has read enough (or waited long enough).
    while (::read(peer.get(), &c, 1) > 0) {
    }
  }

  UniqueFd listener_;
  std::string answer_;
  Answers answers_;
  std::thread server_;
};

// A `status` answer of about `bytes`, as a node with many tenants gives.
std::string status_of(size_t bytes) {
  return R"({"ok":true,"pad":")" + std::string(bytes, 'x') + "\"}\n";
}

TEST(AdminClient, AnOperatorsToolReadsAStatusOfSeveralMebibytesWhole) {
  test_support::TempDir dir("quanta-admin-client");
  FakeAdminSocket arbiter(dir.file("admin.sock"), status_of(6 << 20));
  const AdminReply reply = admin_request(dir.file("admin.sock"), {{"cmd", "status"}},
                                         10'000'000'000, kStatusAnswerBytes);
  ASSERT_EQ(reply.outcome, AdminOutcome::kAnswered) << reply.reason;
  EXPECT_EQ(reply.response["pad"].get<std::string>().size(), size_t{6} << 20);
}

TEST(AdminClient, AnAnswerLongerThanTheCallerReadsIsRefusedNamingTheLimit) {
  test_support::TempDir dir("quanta-admin-client");
  FakeAdminSocket arbiter(dir.file("admin.sock"), status_of(2 << 20));
  const AdminReply reply =
      admin_request(dir.file("admin.sock"), {{"cmd", "register"}}, 10'000'000'000);
  EXPECT_EQ(reply.outcome, AdminOutcome::kUnreachable);
  EXPECT_NE(reply.reason.find("more than 1048576 bytes"), std::string::npos) << reply.reason;
  EXPECT_FALSE(reply.timed_out);
}

TEST(AdminClient, ASilentArbiterCostsTheDeadlineAndNoMore) {
  test_support::TempDir dir("quanta-admin-client");
  FakeAdminSocket arbiter(dir.file("admin.sock"), "");
  const auto start = std::chrono::steady_clock::now();
  const AdminReply reply = admin_request(dir.file("admin.sock"), {{"cmd", "status"}}, 300'000'000);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(reply.outcome, AdminOutcome::kUnreachable);
  EXPECT_TRUE(reply.timed_out) << reply.reason;
  EXPECT_GE(waited, 0.29);
  EXPECT_LT(waited, 5.0) << "a generous bound for a shared machine";
}

TEST(AdminClient, ARefusedConnectKeepsItsErrnoAndARefusalItsErrorLine) {
  test_support::TempDir dir("quanta-admin-client");
  AdminReply reply = admin_request(dir.file("absent.sock"), {{"cmd", "status"}}, 1'000'000'000);
  EXPECT_EQ(reply.outcome, AdminOutcome::kUnreachable);
  EXPECT_EQ(reply.connect_error, ENOENT) << reply.reason;
  FakeAdminSocket arbiter(dir.file("admin.sock"), "{\"ok\":false,\"error\":\"no pod p\"}\n");
  reply = admin_request(dir.file("admin.sock"), {{"cmd", "set"}}, 10'000'000'000);
  EXPECT_EQ(reply.outcome, AdminOutcome::kRefused);
  EXPECT_EQ(reply.reason, "no pod p");
  EXPECT_EQ(reply.connect_error, 0);
}

// A refusal the arbiter sends before it closes is the caller's answer even when its request
// was still being sent: the caller reports the reason ("too many admin clients") rather
// than a broken pipe, and is not killed by SIGPIPE.
TEST(AdminClient, ARefusalSentBeforeTheRequestWasReadIsStillTheAnswer) {
  test_support::TempDir dir("quanta-admin-client");
  FakeAdminSocket arbiter(dir.file("admin.sock"),
                          "{\"ok\":false,\"error\":\"too many admin clients (64)\"}\n",
                          Answers::kAtOnceAndCloses);
  // Larger than a socket buffer, so the send is still under way when the arbiter closes.
  const nlohmann::json request = {{"cmd", "status"}, {"pad", std::string(8 << 20, 'x')}};
  const AdminReply reply = admin_request(dir.file("admin.sock"), request, 10'000'000'000);
  EXPECT_EQ(reply.outcome, AdminOutcome::kRefused) << reply.reason;
  EXPECT_EQ(reply.reason, "too many admin clients (64)");
}

}  // namespace
}  // namespace quanta::hosted
