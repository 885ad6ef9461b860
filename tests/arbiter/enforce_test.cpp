// What the node enforces beyond the shim's cooperation: attachment only to the GPUs a
// container was given, refusals that carry the node's unplaced rule, and NVML's
// per-process view reconciled with the registry (unmanaged processes shown, pods over
// their cap by NVML's count reported, denied or killed). Processes that bypass Quanta are
// quanta-tenant run straight on simgpu, without the shim.
#include <sys/un.h>

#include "tests/arbiter/daemon_harness.h"

namespace quanta::arbiter {
namespace {

using namespace quanta::arbiter::testing;

std::string unique(const std::string& what) {
  static int n = 0;
  return "quanta-test-" + what + "-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

// quanta-tenant on this daemon's simgpu without the shim (it bypasses Quanta), moved into
// `cg` (when given) before it touches the GPU, started as `argv0` (its command name).
class Bypass {
 public:
  Bypass(Daemon& d, TestCgroup* cg, const std::vector<std::string>& args,
         const std::string& argv0 = "") {
    std::string program = QUANTA_TENANT_BIN;
    if (!argv0.empty()) {
      program = d.dir() + "/" + argv0;
      std::filesystem::create_symlink(QUANTA_TENANT_BIN, program);
    }
    int go[2];
    EXPECT_EQ(pipe2(go, O_CLOEXEC), 0);
    pid = fork();
    if (pid == 0) {
      char c;
      if (::read(go[0], &c, 1) != 1) _exit(1);
      setenv("SIMGPU_STATE", d.sim_state().c_str(), 1);
      setenv("SIMGPU_DEVICES", "2", 1);
      setenv("LD_LIBRARY_PATH", QUANTA_SIM_DIR, 1);
      unsetenv("LD_PRELOAD");
      int null = ::open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(program.c_str()));
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(program.c_str(), argv.data());
      _exit(127);
    }
    ::close(go[0]);
    if (cg != nullptr) cg->add(pid);
    EXPECT_EQ(::write(go[1], "g", 1), 1);
    ::close(go[1]);
  }
  ~Bypass() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  // Waits up to `ms` for the process to end; its wait status, or -1 while it runs.
  int wait(int ms) {
    int status = -1;
    const bool ended = wait_for([&] { return waitpid(pid, &status, WNOHANG) == pid; }, ms);
    if (!ended) return -1;
    pid = 0;
    return status;
  }
  pid_t pid = 0;
};

const json* find_by_pid(const json& list, pid_t pid) {
  for (const json& e : list) {
    if (e.value("pid", 0) == pid) return &e;
  }
  return nullptr;
}

// ---- devices ---------------------------------------------------------------------------

TEST(ArbiterEnforce, AttachIsLimitedToTheGpusTheContainerWasGiven) {
  Daemon d;
  d.start();
  const std::vector<std::string> uuids = d.uuids();
  ASSERT_EQ(uuids.size(), 2u);
  TestCgroup given(unique("given"));
  TestCgroup unlisted(unique("unlisted"));
  if (!given.ok() || !unlisted.ok()) GTEST_SKIP() << "no writable cgroup v2";
  ASSERT_TRUE(register_pod(d, "c-given", "prod", "one", given.path(), {{"memory-limit", "1Gi"}},
                           json::array({uuids[0]}))["ok"]);
  ASSERT_TRUE(register_pod(d, "c-all", "prod", "two", unlisted.path(), json::object())["ok"]);

  ChildTenant intruder(d, "", uuids[1]);
  ASSERT_TRUE(given.add(intruder.pid));
  ChildReport r = intruder.command('H');
  EXPECT_EQ(r.type, static_cast<uint32_t>(MessageType::kAttachFailed))
      << "a container attached to a GPU it was not given";
  EXPECT_NE(std::string(r.reason).find("was not given"), std::string::npos) << r.reason;
  EXPECT_NE(std::string(r.reason).find(uuids[0]), std::string::npos) << r.reason;
  EXPECT_EQ(r.action, static_cast<uint32_t>(common::RefusedAction::kDeny))
      << "a capped pod refused a GPU must not use it uncapped (unplaced = closed-if-capped)";

  ChildTenant owner(d, "", uuids[0]);
  ASSERT_TRUE(given.add(owner.pid));
  EXPECT_EQ(owner.command('H').type, static_cast<uint32_t>(MessageType::kAttached));
  // A registration that names no devices, and a development process, keep every GPU.
  ChildTenant any(d, "", uuids[1]);
  ASSERT_TRUE(unlisted.add(any.pid));
  EXPECT_EQ(any.command('H').type, static_cast<uint32_t>(MessageType::kAttached));
  ChildTenant dev(d, "pod-dev", uuids[1]);
  EXPECT_EQ(dev.command('H').type, static_cast<uint32_t>(MessageType::kAttached));
}

// ---- fail closed where the node says so ------------------------------------------------

uint32_t refusal_action(const std::string& unplaced) {
  Daemon d("[enforce]\nunplaced = \"" + unplaced + "\"\n", /*allow_unregistered=*/false);
  d.start();
  UniqueFd c = d.connect();
  send_message(c.get(), hello("pod-x"));
  Packet r = receive(c.get());
  EXPECT_EQ(r.type(), MessageType::kRefused);
  return static_cast<uint32_t>(r.as<common::RefusedMessage>().action);
}

TEST(ArbiterEnforce, ARefusalCarriesTheNodesRuleForUnplacedProcesses) {
  EXPECT_EQ(refusal_action("closed"), static_cast<uint32_t>(common::RefusedAction::kDeny));
  EXPECT_EQ(refusal_action("open"), static_cast<uint32_t>(common::RefusedAction::kRunOpen));
  EXPECT_EQ(refusal_action("closed-if-capped"),
            static_cast<uint32_t>(common::RefusedAction::kRunOpen))
      << "an unregistered process has no cap of its own";
}

TEST(ArbiterEnforce, EnforcementBindsRegisteredContainersAndNotDevelopmentProcesses) {
  Daemon d;
  d.start();
  TestCgroup cg(unique("enforced"));
  if (!cg.ok()) GTEST_SKIP() << "no writable cgroup v2";
  ASSERT_TRUE(register_pod(d, "c-enf", "prod", "enf", cg.path(), json::object())["ok"]);
  int flags[2] = {-1, -1};
  for (int registered = 0; registered < 2; ++registered) {
    int out[2];
    ASSERT_EQ(pipe(out), 0);
    pid_t child = fork();
    if (child == 0) {
      char c;
      if (::read(out[0], &c, 1) != 1) _exit(1);
      UniqueFd conn = d.connect();
      auto h = hello("pod-dev");
      send_with_fds(conn.get(), &h, sizeof(h), {});
      Packet w = receive(conn.get());
      _exit(w.type() == MessageType::kWelcome
                ? static_cast<int>(w.as<common::WelcomeMessage>().flags)
                : 100);
    }
    if (registered) cg.add(child);
    EXPECT_EQ(::write(out[1], "g", 1), 1);
    int status = 0;
    waitpid(child, &status, 0);
    flags[registered] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    ::close(out[0]);
    ::close(out[1]);
  }
  // Both are first admissions: their entries are fresh.
  const int fresh = static_cast<int>(common::kWelcomeFreshEntry);
  EXPECT_EQ(flags[1], static_cast<int>(common::kWelcomeEnforced) | fresh);
  EXPECT_EQ(flags[0], fresh) << "a development process was told the node enforces";
}

// ---- NVML reconciliation ---------------------------------------------------------------

TEST(ArbiterEnforce, ProcessesQuantaDoesNotManageAreShownWithTheirNamesEscaped) {
  Daemon d("nvml_interval = \"100ms\"\n");
  d.start();
  const std::string name = "evil\x1b[2J";
  Bypass stranger(d, nullptr, {"alloc", "--bytes", "64Mi", "--count", "1", "--hold-ms", "8000"},
                  name);
  json seen;
  ASSERT_TRUE(wait_for(
      [&] {
        json s = d.admin({{"cmd", "status"}});
        for (const json& g : s["gpus"]) {
          if (!g.contains("unmanaged")) continue;
          if (const json* u = find_by_pid(g["unmanaged"], stranger.pid)) {
            seen = *u;
            return u->value("memory_used", 0ull) >= (64ull << 20);
          }
        }
        return false;
      },
      5000))
      << "NVML's unmanaged process is not in the status";
  EXPECT_EQ(seen["command"], name);
  EXPECT_TRUE(seen["pod"].is_null());
  Ran table = run({QUANTACTL_BIN, "--admin-socket", d.admin_socket(), "status"});
  EXPECT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find("evil\\x1b[2J"), std::string::npos) << table.out;
  EXPECT_EQ(table.out.find('\x1b'), std::string::npos) << "a tenant's escape reached the terminal";
}

class OverCap : public ::testing::TestWithParam<std::string> {};

TEST_P(OverCap, APodOverItsCapByNvmlsCountIsActedOnAsTheNodeSays) {
  const std::string action = GetParam();
  Daemon d("nvml_interval = \"100ms\"\n[enforce]\nover_cap = \"" + action + "\"\n");
  d.start();
  const std::string uuid = d.uuids()[0];
  TestCgroup cg(unique("capped"));
  if (!cg.ok()) GTEST_SKIP() << "no writable cgroup v2";
  ASSERT_TRUE(
      register_pod(d, "c-cap", "prod", "capped", cg.path(), {{"memory-limit", "64Mi"}})["ok"]);
  ChildTenant member(d, "", uuid);
  ASSERT_TRUE(cg.add(member.pid));
  ChildReport m = member.command('H');
  ASSERT_EQ(m.type, static_cast<uint32_t>(MessageType::kAttached)) << m.reason;
  auto* pod = d.pod(m.pod_index);
  ASSERT_NE(pod, nullptr);
  ASSERT_EQ(pod->memory_cap[0].load(), 64ull << 20);
  // A process of the same container that bypassed the shim and took twice the cap.
  Bypass rogue(d, &cg, {"alloc", "--bytes", "128Mi", "--count", "1", "--hold-ms", "8000"});
  if (action == "report") {
    EXPECT_TRUE(wait_for(
        [&] {
          json s = d.admin({{"cmd", "status"}});
          for (const json& o : s["gpus"][0]["over_cap"]) {
            if (o["pod"] == "prod/capped" && o["action"] == "report") return true;
          }
          return false;
        },
        5000))
        << "the pod over its cap was not reported";
    EXPECT_EQ(rogue.wait(0), -1) << "report must not kill";
  } else if (action == "deny") {
    EXPECT_TRUE(wait_for([&] { return pod->memory_cap[0].load() == 1; }, 5000))
        << "the pod's cap was not held: " << pod->memory_cap[0].load();
    kill(rogue.pid, SIGKILL);
    rogue.wait(2000);
    EXPECT_TRUE(
        wait_for([&] { return pod->memory_cap[0].load() == (64ull << 20); }, 5000))
        << "the cap did not come back once the pod was under it";
  } else {
    const int status = rogue.wait(5000);
    EXPECT_TRUE(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the process over the pod's cap was not killed";
  }
  EXPECT_TRUE(d.alive());
}

INSTANTIATE_TEST_SUITE_P(ArbiterEnforce, OverCap, ::testing::Values("report", "deny", "kill"));

// The node's default holds a cap against a pod that lies about its usage. Its ledger words
// are its own to write: here the pod writes its ledger down to 0 and one of its processes
// takes four times the cap. NVML's count decides, and with no [enforce] table at all the
// process is killed within a few samples (nvml_interval, 1 s by default).
TEST(EnforceTest, APodThatWritesItsLedgerDownIsKilledByTheNodesDefault) {
  Daemon d;
  d.start();
  const std::string uuid = d.uuids()[0];
  TestCgroup cg(unique("liar"));
  if (!cg.ok()) GTEST_SKIP() << "no writable cgroup v2";
  ASSERT_TRUE(
      register_pod(d, "c-liar", "prod", "liar", cg.path(), {{"memory-limit", "64Mi"}})["ok"]);
  ChildTenant member(d, "", uuid);
  ASSERT_TRUE(cg.add(member.pid));
  ChildReport m = member.command('H');
  ASSERT_EQ(m.type, static_cast<uint32_t>(MessageType::kAttached)) << m.reason;
  common::PodRegion* region = d.pod(m.pod_index);
  ASSERT_NE(region, nullptr);
  Bypass liar(d, &cg, {"alloc", "--bytes", "256Mi", "--count", "1", "--hold-ms", "20000"});
  const uint64_t start = common::monotonic_ns();
  int status = -1;
  while (status == -1 && common::monotonic_ns() - start < 8 * common::kNsPerSec) {
    region->memory_used[m.gpu_index].store(0);  // the lie, kept up
    status = liar.wait(50);
  }
  EXPECT_TRUE(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "a pod that wrote its ledger down kept four times its cap under the node's default";
  EXPECT_TRUE(d.alive());
  EXPECT_EQ(d.admin({{"cmd", "status"}})["enforce"]["over_cap"], "kill");
}

// An honest pod at its cap is never taken for a liar: with the slack, a pod whose NVML
// count is its cap plus the driver's rounding stays untouched under the default.
TEST(EnforceTest, APodAtItsCapByNvmlsCountIsLeftAlone) {
  Daemon d("nvml_interval = \"100ms\"\n");
  d.start();
  const std::string uuid = d.uuids()[0];
  TestCgroup cg(unique("honest"));
  if (!cg.ok()) GTEST_SKIP() << "no writable cgroup v2";
  ASSERT_TRUE(
      register_pod(d, "c-honest", "prod", "honest", cg.path(), {{"memory-limit", "64Mi"}})["ok"]);
  // 64 MiB and 16 MiB the ledger never saw (a module's code, the driver's rounding).
  Bypass honest(d, &cg, {"alloc", "--bytes", "80Mi", "--count", "1", "--hold-ms", "3000"});
  const int status = honest.wait(6000);
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "a pod within its cap's slack was acted on (status " << status << ")";
}

// What a context costs is measured on the node's own GPUs when the arbiter starts, so the
// ledger charges what NVML will count; a size in the config overrides it.
TEST(ContextOverhead, IsMeasuredOnTheNodesGpusAtStart) {
  Daemon d;
  d.set_env("SIMGPU_CONTEXT_MEMORY", "518Mi");
  d.start();
  const json overhead = d.admin({{"cmd", "status"}})["context_overhead"];
  EXPECT_EQ(overhead["source"], "measured") << overhead;
  EXPECT_EQ(overhead["bytes"], 518ull << 20) << overhead;
  ASSERT_EQ(overhead["measured"].size(), 1u) << "one model, measured once: " << overhead;
  EXPECT_FALSE(overhead.contains("errors")) << overhead;
}

TEST(ContextOverhead, AConfiguredSizeIsChargedAsGiven) {
  Daemon d("[shim]\ncontext_overhead = \"64Mi\"\n");
  d.set_env("SIMGPU_CONTEXT_MEMORY", "518Mi");
  d.start();
  const json overhead = d.admin({{"cmd", "status"}})["context_overhead"];
  EXPECT_EQ(overhead["source"], "config") << overhead;
  EXPECT_EQ(overhead["bytes"], 64ull << 20) << overhead;
}

}  // namespace
}  // namespace quanta::arbiter
