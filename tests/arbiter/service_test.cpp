// The Arbiter held by a test: constructed in this process on a temporary node config and
// simgpu's NVML, and asked directly through the calls its servers make (its AdminService's
// handle_admin for the admin socket, admit and attach for the tenant socket) without a socket or a second
// process between. Admission, attach, the admin handlers, the figures and a restart's
// re-adoption are each checked on the live object, so a failure names the call that broke.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "arbiter/arbiter.h"
#include "arbiter/serving/peer_identity.h"
#include "arbiter/serving/tenant_protocol.h"
#include "common/version.h"
#include "config/node_config.h"
#include "tests/support/temp_dir.h"

namespace quanta::arbiter {
namespace {

using nlohmann::json;
using test_support::TempDir;

// simgpu's NVML, loaded once under the driver library's name: the arbiter's own
// dlopen("libnvidia-ml.so.1") then finds it, as it finds the driver's on a node.
class SimulatedNvml : public ::testing::Environment {
 public:
  void SetUp() override {
    state_ = "quanta-service-" + std::to_string(getpid()) + "-sim";
    setenv("SIMGPU_STATE", state_.c_str(), 1);
    setenv("SIMGPU_DEVICES", "2", 1);
    const std::string path = std::string(QUANTA_SIM_DIR) + "/libnvidia-ml.so.1";
    library_ = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    ASSERT_NE(library_, nullptr) << "cannot load simgpu's NVML from " << path << ": " << dlerror();
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove("/dev/shm/" + state_, ec);
  }

 private:
  std::string state_;
  void* library_ = nullptr;
};

const auto* const kNvml = ::testing::AddGlobalTestEnvironment(new SimulatedNvml);

// A tenant process as the arbiter sees one: a pid it holds by a pidfd, which maps the
// regions the arbiter hands it (as libquanta.so maps the descriptors of Welcome and
// Attached), so that a restarted arbiter finds them in its maps. Forked before its Hello,
// it keeps only its two pipes: each line on its input is a path to map, and it answers
// one byte per mapping.
class Tenant {
 public:
  Tenant() {
    int paths[2];
    int acks[2];
    if (pipe2(paths, O_CLOEXEC) != 0 || pipe2(acks, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2: " << std::strerror(errno);
      return;
    }
    pid_ = fork();
    if (pid_ == 0) {
      dup2(paths[0], 0);
      dup2(acks[1], 1);
      syscall(SYS_close_range, 3u, ~0u, 0u);  // none of the arbiter's descriptors (its lock)
      serve();
    }
    ::close(paths[0]);
    ::close(acks[1]);
    paths_ = paths[1];
    acks_ = acks[0];
    peer_.pid = pid_;
    peer_.uid = getuid();
    peer_.pidfd.reset(static_cast<int>(syscall(SYS_pidfd_open, pid_, 0)));
    EXPECT_TRUE(peer_.pidfd) << "pidfd_open: " << std::strerror(errno);
  }
  ~Tenant() {
    kill();
    ::close(paths_);
    ::close(acks_);
  }
  Tenant(const Tenant&) = delete;
  Tenant& operator=(const Tenant&) = delete;

  const PeerIdentity& peer() const { return peer_; }
  pid_t pid() const { return pid_; }

  // Maps the region behind `fd`, a descriptor of this process, in the tenant.
  bool map(int fd) {
    const std::string line = "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(fd) + "\n";
    if (::write(paths_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return false;
    pollfd p{acks_, POLLIN, 0};
    char ack = 0;
    return poll(&p, 1, 5000) == 1 && ::read(acks_, &ack, 1) == 1 && ack == 'm';
  }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }

 private:
  [[noreturn]] static void serve() {
    char line[256];
    size_t have = 0;
    for (;;) {
      const ssize_t n = ::read(0, line + have, sizeof(line) - 1 - have);
      if (n <= 0) {
        for (;;) pause();  // the test is done with it: wait for its SIGKILL
      }
      have += static_cast<size_t>(n);
      char* end = static_cast<char*>(std::memchr(line, '\n', have));
      if (end == nullptr) continue;
      *end = '\0';
      const bool mapped = map_path(line);
      (void)!::write(1, mapped ? "m" : "x", 1);
      have = 0;
    }
  }
  static bool map_path(const char* path) {
    // A pod region is the process's to write; a control region it may only read.
    int fd = ::open(path, O_RDWR);
    if (fd < 0) fd = ::open(path, O_RDONLY);
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0) return false;
    const size_t size = static_cast<size_t>(st.st_size);
    void* at = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (at == MAP_FAILED) at = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    return at != MAP_FAILED;
  }

  pid_t pid_ = -1;
  int paths_ = -1;
  int acks_ = -1;
  PeerIdentity peer_;
};

class ArbiterService : public ::testing::Test {
 protected:
  ArbiterService() {
    static int counter = 0;
    scope_ = "qas" + std::to_string(getpid()) + "x" + std::to_string(counter++);
  }
  ~ArbiterService() override {
    arbiter_.reset();
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(scope_ + ".", 0) == 0) std::filesystem::remove(e.path(), ec);
    }
  }

  // The node config as the arbiter reads it from its file; `extra` adds tables.
  config::NodeConfig node_config(const std::string& extra) const {
    return config::parse_config(
        "[node]\nscope = \"" + scope_ + "\"\ntenant_socket = \"" + dir_.file("tenant.sock") +
            "\"\nadmin_socket = \"" + dir_.file("admin.sock") + "\"\nstate_dir = \"" +
            dir_.file("state") + "\"\nallow_unregistered = true\nnvml_interval = 0\n" +
            "[shim]\ncontext_overhead = \"300Mi\"\n" + extra,
        dir_.file("quanta.toml"));
  }
  Arbiter& start(const std::string& extra = "") {
    arbiter_.reset();  // its successor takes the same scope, as a restarted daemon does
    arbiter_ = std::make_unique<Arbiter>(node_config(extra));
    return *arbiter_;
  }
  json ask(const json& request) { return arbiter_->admin().handle_admin(request); }
  std::string uuid(size_t index) {
    json status = ask({{"cmd", "status"}});
    return status["gpus"].at(index).value("uuid", "");
  }

  Admission admit(const PeerIdentity& peer, const std::string& cgroup, const std::string& pod) {
    return arbiter_->admit(peer, cgroup, pod, common::kLayoutVersion);
  }
  Attachment attach(pid_t pid, const std::string& gpu_uuid) {
    TenantMessage request;
    request.kind = TenantMessage::Kind::kAttach;
    request.version = common::kWireVersion;
    request.uuid = gpu_uuid;
    return arbiter_->attach(pid, request);
  }
  json tenants_of(size_t gpu) { return ask({{"cmd", "status"}})["gpus"].at(gpu)["tenants"]; }
  // The register request quanta-hook sends for container c0ffee of pod team/trainer (uid
  // `pod_uid`) in `cgroup`; callers add devices or a policy.
  static json registration(const std::string& pod_uid, const std::string& cgroup) {
    return {{"cmd", "register"},    {"container_id", "c0ffee"}, {"pod_uid", pod_uid},
            {"pod_name", "trainer"}, {"pod_namespace", "team"},  {"cgroup_path", cgroup}};
  }

  TempDir dir_{"quanta-service"};
  std::string scope_;
  std::unique_ptr<Arbiter> arbiter_;
};

// ---- the admin handlers -----------------------------------------------------------------

TEST_F(ArbiterService, StatusNamesTheScopeAndEveryManagedGpuWithNoTenantAtStart) {
  start();
  json status = ask({{"cmd", "status"}});
  ASSERT_TRUE(status.value("ok", false)) << status.dump();
  EXPECT_EQ(status.value("scope", ""), scope_);
  ASSERT_EQ(status["gpus"].size(), 2u);
  for (const json& gpu : status["gpus"]) {
    EXPECT_EQ(gpu.value("uuid", "").rfind("GPU-", 0), 0u) << gpu.dump();
    EXPECT_TRUE(gpu["tenants"].empty()) << gpu.dump();
  }
  EXPECT_EQ(status["context_overhead"].value("source", ""), "config");
  EXPECT_EQ(status["context_overhead"].value("bytes", 0ull), 300ull << 20);
}

TEST_F(ArbiterService, DevicesAnswersEveryGpuOfTheNodeByNameUuidAndMinor) {
  start();
  json devices = ask({{"cmd", "devices"}});
  ASSERT_TRUE(devices.value("ok", false)) << devices.dump();
  ASSERT_EQ(devices["devices"].size(), 2u);
  EXPECT_EQ(devices["devices"][0].value("uuid", ""), uuid(0));
  EXPECT_EQ(devices["devices"][1].value("uuid", ""), uuid(1));
  EXPECT_FALSE(devices["devices"][0].value("mig", true));
}

TEST_F(ArbiterService, ARequestItCannotParseIsAnsweredWithWhatIsAllowed) {
  start();
  json answer = ask({{"cmd", "reboot"}});
  EXPECT_FALSE(answer.value("ok", true));
  EXPECT_NE(answer.value("error", "").find("unknown cmd \"reboot\": use status"), std::string::npos)
      << answer.dump();
}

TEST_F(ArbiterService, SetOverridesAKnownPodAndPolicySaysWhereEachValueCameFrom) {
  start("[pod.\"team/trainer\"]\nweight = 2\n");
  json answer = ask({{"cmd", "set"}, {"pod", "team/trainer"}, {"values", {{"priority", "interactive"}}}});
  ASSERT_TRUE(answer.value("ok", false)) << answer.dump();
  EXPECT_NE(answer.value("note", "").find("has no process now"), std::string::npos);

  json policy = ask({{"cmd", "policy"}, {"pod", "trainer"}});  // by its name alone
  ASSERT_TRUE(policy.value("ok", false)) << policy.dump();
  EXPECT_EQ(policy.value("pod", ""), "team/trainer");
  std::map<std::string, std::pair<std::string, std::string>> values;
  for (const json& v : policy["values"])
    values[v.value("key", "")] = {v.value("value", ""), v.value("source", "")};
  EXPECT_EQ(values["weight"], std::make_pair(std::string("2"), std::string("node table")));
  EXPECT_EQ(values["priority"], std::make_pair(std::string("interactive"), std::string("override")));

  json overrides = ask({{"cmd", "policy"}});
  EXPECT_EQ(overrides["overrides"]["team/trainer"]["priority"], "interactive") << overrides.dump();
}

TEST_F(ArbiterService, ABadValueIsRefusedByNameAndLeavesTheEarlierOverrideAsItWas) {
  start("[pod.\"team/trainer\"]\nweight = 2\n");
  ASSERT_TRUE(ask({{"cmd", "set"}, {"pod", "team/trainer"}, {"values", {{"weight", "5"}}}})
                  .value("ok", false));
  json bad =
      ask({{"cmd", "set"}, {"pod", "team/trainer"}, {"values", {{"weight", "lots"}}}});
  EXPECT_FALSE(bad.value("ok", true));
  EXPECT_NE(bad.value("error", "").find("weight"), std::string::npos) << bad.dump();
  EXPECT_EQ(ask({{"cmd", "policy"}})["overrides"]["team/trainer"]["weight"], "5");

  json unknown = ask({{"cmd", "set"}, {"pod", "team/ghost"}, {"values", {{"weight", "3"}}}});
  EXPECT_FALSE(unknown.value("ok", true));
  EXPECT_NE(unknown.value("error", "").find("is not known to this arbiter"), std::string::npos)
      << unknown.dump();
}

TEST_F(ArbiterService, UnsetRemovesOneKeyThenTheRestAndSaysWhatAPodHasLeft) {
  start("[pod.\"team/trainer\"]\nweight = 2\n");
  ASSERT_TRUE(ask({{"cmd", "set"},
                   {"pod", "team/trainer"},
                   {"values", {{"weight", "5"}, {"priority", "best-effort"}}}})
                  .value("ok", false));
  ASSERT_TRUE(ask({{"cmd", "unset"}, {"pod", "team/trainer"}, {"keys", {"weight"}}})
                  .value("ok", false));
  EXPECT_EQ(ask({{"cmd", "policy"}})["overrides"]["team/trainer"],
            json({{"priority", "best-effort"}}));
  json missing = ask({{"cmd", "unset"}, {"pod", "team/trainer"}, {"keys", {"weight"}}});
  EXPECT_FALSE(missing.value("ok", true));
  EXPECT_NE(missing.value("error", "").find("it has: priority"), std::string::npos)
      << missing.dump();
  ASSERT_TRUE(ask({{"cmd", "unset"}, {"pod", "team/trainer"}}).value("ok", false));
  EXPECT_TRUE(ask({{"cmd", "policy"}})["overrides"].empty());
}

TEST_F(ArbiterService, RegisterGivesThePodItsAnnotationsAndUnregisterForgetsTheContainerOnce) {
  start();
  json request = registration("uid-1", "/kubepods/poduid-1/c0ffee");
  request["policy"] = {{"quanta.dev/weight", "4"}};
  json answer = ask(request);
  ASSERT_TRUE(answer.value("ok", false)) << answer.dump();
  EXPECT_EQ(answer.value("pod", ""), "team/trainer");
  bool annotated = false;
  const json policy = ask({{"cmd", "policy"}, {"pod", "team/trainer"}});
  for (const json& v : policy.at("values"))
    annotated |= v.value("key", "") == "weight" && v.value("value", "") == "4" &&
                 v.value("source", "") == "annotation";
  EXPECT_TRUE(annotated) << policy.dump();

  EXPECT_TRUE(ask({{"cmd", "unregister"}, {"container_id", "c0ffee"}}).value("ok", false));
  json again = ask({{"cmd", "unregister"}, {"container_id", "c0ffee"}});
  EXPECT_FALSE(again.value("ok", true));
  EXPECT_NE(again.value("error", "").find("no registered container c0ffee"), std::string::npos);
}

TEST_F(ArbiterService, DrainTakesAnIndexOrAUuidAndARestartedArbiterKeepsItDrained) {
  start();
  const std::string second = uuid(1);
  json drained = ask({{"cmd", "drain"}, {"gpu", 1}});
  ASSERT_TRUE(drained.value("ok", false)) << drained.dump();
  EXPECT_EQ(drained.value("uuid", ""), second);
  EXPECT_TRUE(drained.value("draining", false));

  json wrong = ask({{"cmd", "drain"}, {"gpu", "GPU-nowhere"}});
  EXPECT_FALSE(wrong.value("ok", true));
  EXPECT_NE(wrong.value("error", "").find("managed: 0 " + uuid(0) + ", 1 " + second),
            std::string::npos)
      << wrong.dump();

  start();  // a restart on the same state folder
  EXPECT_TRUE(ask({{"cmd", "status"}})["gpus"][1].value("draining", false));
  EXPECT_FALSE(ask({{"cmd", "status"}})["gpus"][0].value("draining", true));
  ASSERT_TRUE(ask({{"cmd", "undrain"}, {"gpu", second}}).value("ok", false));
  start();
  EXPECT_FALSE(ask({{"cmd", "status"}})["gpus"][1].value("draining", true));
}

// ---- admission and attach ---------------------------------------------------------------

TEST_F(ArbiterService, AProcessNamingItsPodIsAdmittedAndAttachesAsATenantOfThatGpu) {
  start();
  Tenant process;
  const PeerIdentity& peer = process.peer();
  const Admission admission = admit(peer, "/system.slice/batch.service", "team/notebook");
  ASSERT_TRUE(admission.admitted) << admission.reason;
  EXPECT_EQ(admission.pod_key, "team/notebook");
  EXPECT_GE(admission.pod_fd, 0);
  EXPECT_EQ(admission.context_overhead, 300ull << 20);

  const Attachment attachment = attach(peer.pid, uuid(1));
  ASSERT_TRUE(attachment.attached) << attachment.reason;
  EXPECT_EQ(attachment.gpu_index, 1u);
  EXPECT_GE(attachment.control_fd, 0);
  ASSERT_EQ(tenants_of(1).size(), 1u);
  EXPECT_EQ(tenants_of(1)[0].value("pid", 0), peer.pid);
  EXPECT_EQ(tenants_of(1)[0].value("pod", ""), "team/notebook");
  EXPECT_TRUE(tenants_of(0).empty());

  // The same process again on the same GPU keeps its slot.
  EXPECT_EQ(attach(peer.pid, uuid(1)).slot, attachment.slot);
  const Attachment elsewhere = attach(peer.pid, "GPU-nowhere");
  EXPECT_FALSE(elsewhere.attached);
  EXPECT_NE(elsewhere.reason.find("is not managed by this arbiter"), std::string::npos)
      << elsewhere.reason;
}

TEST_F(ArbiterService, WithoutRegistrationOrANamedPodAProcessIsRefusedWithWhatToSet) {
  start();
  Tenant process;
  const PeerIdentity& peer = process.peer();
  const Admission admission = admit(peer, "/system.slice/batch.service", "");
  EXPECT_FALSE(admission.admitted);
  EXPECT_NE(admission.reason.find("set QUANTA_POD=<name>"), std::string::npos) << admission.reason;
  EXPECT_FALSE(attach(peer.pid, uuid(0)).attached);
  EXPECT_TRUE(tenants_of(0).empty());
}

TEST_F(ArbiterService, ARegisteredContainersProcessJoinsItsPodAndOnlyItsOwnGpus) {
  start();
  const std::string cgroup = "/kubepods/poduid-7/c0ffee";
  json request = registration("uid-7", cgroup);
  request["devices"] = {uuid(0)};
  ASSERT_TRUE(ask(request).value("ok", false));
  Tenant process;
  const PeerIdentity& peer = process.peer();
  // What the process claims does not matter once its cgroup is a registered container's.
  const Admission admission = admit(peer, cgroup, "team/elsewhere");
  ASSERT_TRUE(admission.admitted) << admission.reason;
  EXPECT_EQ(admission.pod_key, "team/trainer");
  EXPECT_TRUE(attach(peer.pid, uuid(0)).attached);
  const Attachment other = attach(peer.pid, uuid(1));
  EXPECT_FALSE(other.attached);
  EXPECT_NE(other.reason.find(uuid(1)), std::string::npos) << other.reason;
  EXPECT_TRUE(tenants_of(1).empty());
}

TEST_F(ArbiterService, ANamedPodThatIsARegisteredPodsIsRefusedToOtherProcesses) {
  start();
  ASSERT_TRUE(ask(registration("uid-7", "/kubepods/poduid-7/c0ffee")).value("ok", false));
  Tenant process;
  const PeerIdentity& peer = process.peer();
  const Admission admission = admit(peer, "/system.slice/intruder.service", "team/trainer");
  EXPECT_FALSE(admission.admitted);
  EXPECT_NE(admission.reason.find("only its own containers join it"), std::string::npos)
      << admission.reason;
}

// ---- figures and explain ----------------------------------------------------------------

TEST_F(ArbiterService, TopAndExplainAnswerForATenantAndExplainRefusesAPodItDoesNotKnow) {
  start();
  Tenant process;
  const PeerIdentity& peer = process.peer();
  ASSERT_TRUE(admit(peer, "/system.slice/batch.service", "team/notebook").admitted);
  ASSERT_TRUE(attach(peer.pid, uuid(0)).attached);

  json top = ask({{"cmd", "top"}});
  ASSERT_TRUE(top.value("ok", false)) << top.dump();
  EXPECT_NE(top.dump().find("team/notebook"), std::string::npos) << top.dump();

  json explain = ask({{"cmd", "explain"}, {"pod", "notebook"}});
  ASSERT_TRUE(explain.value("ok", false)) << explain.dump();
  EXPECT_NE(explain.dump().find("team/notebook"), std::string::npos) << explain.dump();

  json unknown = ask({{"cmd", "explain"}, {"pod", "team/ghost"}});
  EXPECT_FALSE(unknown.value("ok", true)) << unknown.dump();
}

// ---- restart --------------------------------------------------------------------------

TEST_F(ArbiterService, ARestartedArbiterReadoptsALiveTenantInItsPodAndSlot) {
  start();
  Tenant process;
  const PeerIdentity& peer = process.peer();
  const Admission admission = admit(peer, "/system.slice/batch.service", "team/notebook");
  ASSERT_TRUE(admission.admitted) << admission.reason;
  ASSERT_TRUE(process.map(admission.pod_fd));
  const Attachment before = attach(peer.pid, uuid(0));
  ASSERT_TRUE(before.attached) << before.reason;
  ASSERT_TRUE(process.map(before.control_fd));
  const uint64_t generation = ask({{"cmd", "status"}}).value("generation", 0ull);

  start();  // the next arbiter on the same scope and state folder
  EXPECT_GT(ask({{"cmd", "status"}}).value("generation", 0ull), generation);
  ASSERT_EQ(tenants_of(0).size(), 1u) << ask({{"cmd", "status"}}).dump();
  EXPECT_EQ(tenants_of(0)[0].value("pid", 0), peer.pid);
  EXPECT_EQ(tenants_of(0)[0].value("pod", ""), "team/notebook");
  EXPECT_FALSE(tenants_of(0)[0].value("connected", true));  // until it says Hello again
  // Its Hello and Attach find it where it was.
  const Admission again = admit(peer, "/system.slice/batch.service", "team/notebook");
  ASSERT_TRUE(again.admitted) << again.reason;
  EXPECT_EQ(again.proc_index, admission.proc_index);
  EXPECT_EQ(attach(peer.pid, uuid(0)).slot, before.slot);
}

TEST_F(ArbiterService, ARestartForgetsATenantThatExitedMeanwhileAndAdmitsItsPodAfresh) {
  start();
  Tenant process;
  const Admission admission =
      admit(process.peer(), "/system.slice/batch.service", "team/notebook");
  ASSERT_TRUE(admission.admitted) << admission.reason;
  ASSERT_TRUE(process.map(admission.pod_fd));
  const Attachment attachment = attach(process.pid(), uuid(0));
  ASSERT_TRUE(attachment.attached) << attachment.reason;
  ASSERT_TRUE(process.map(attachment.control_fd));
  arbiter_.reset();
  process.kill();

  start();
  EXPECT_TRUE(tenants_of(0).empty()) << ask({{"cmd", "status"}}).dump();
  Tenant next;
  const Admission fresh = admit(next.peer(), "/system.slice/batch.service", "team/notebook");
  ASSERT_TRUE(fresh.admitted) << fresh.reason;
  ASSERT_TRUE(attach(next.pid(), uuid(0)).attached);
  ASSERT_EQ(tenants_of(0).size(), 1u);
  EXPECT_EQ(tenants_of(0)[0].value("pid", 0), next.pid());
}

}  // namespace
}  // namespace quanta::arbiter
