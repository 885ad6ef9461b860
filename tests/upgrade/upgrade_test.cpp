// Upgrading a node with GPU pods running: pods started under the previous release (its
// libquanta.so and quanta-arbiter, built from this repository's history by
// build-previous.sh) keep their shares, caps and ledger when the node's files are installed
// anew by quanta-install-host and the arbiter is replaced by this build's, as the DaemonSet
// rolls it; pods started after it get this release beside them. Every verdict comes from
// simgpu's execution log, the tenants' own reports and the arbiter's status.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "tests/integration/harness.h"

namespace quanta::integration {
namespace {

constexpr uint64_t kMi = 1ull << 20;
const std::string kPrevious = QUANTA_PREVIOUS_BUILD;

std::vector<std::string> batch(double seconds, const std::string& start_at) {
  return {"batch", "--seconds", std::to_string(seconds), "--kernel-ms", "2", "--depth", "2", "--start-at", start_at};
}

// A node's installed files: the prefix quanta-install-host writes (lib/libquanta.so, ...).
class Node {
 public:
  explicit Node(const World& world) : world_(world), prefix_(world.file("opt/quanta")) {
    std::filesystem::create_directories(prefix_ + "/lib");
  }
  std::string library() const { return prefix_ + "/lib/libquanta.so"; }

  // What the previous release's installer left: its libquanta.so in place.
  void install_previous() {
    std::filesystem::copy_file(kPrevious + "/lib/libquanta.so", library() + ".new",
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::rename(library() + ".new", library());
  }

  // This release's DaemonSet init container: quanta-install-host with this build's payload.
  std::string install_current() {
    const std::string payload = world_.file("payload");
    for (const char* dir : {"/lib", "/bin", "/libexec"}) std::filesystem::create_directories(payload + dir);
    auto copy = [](const std::string& from, const std::string& to) {
      std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
    };
    copy(QUANTA_SHIM_LIBRARY, payload + "/lib/libquanta.so");
    copy(QUANTA_HOOK_LAUNCHER, payload + "/bin/quanta-hook");
    copy(QUANTA_HOOK_PROGRAM, payload + "/libexec/quanta-hook");
    Env env = world_.tenant_env("", false);
    Child installer({QUANTA_INSTALL_HOST, "--prefix=" + prefix_, "--node-config=" + world_.config_path(),
                     "--config=" + world_.file("etc/quanta/quanta.toml"), "--socket=" + world_.tenant_socket(),
                     "--cdi-dir=" + world_.file("etc/cdi"),
                     "--spec-dirs=" + world_.file("etc/cdi") + "," + world_.file("var/run/cdi"),
                     "--payload=" + payload, std::string("--arbiter=") + QUANTA_ARBITER_BINARY},
                    env, world_.file("install.out"), world_.file("install.err"));
    const int code = installer.wait(60);
    EXPECT_EQ(code, 0) << installer.out() << installer.err();
    return installer.out();
  }

  // A container's libquanta.so is a bind mount of the installed file made when the container
  // was created: it keeps that file (inode) whatever is installed later. A hard link made at
  // "creation" pins the inode the same way.
  std::string container_library(const std::string& container) {
    const std::string path = world_.file("container-" + container + ".libquanta.so");
    std::filesystem::create_hard_link(library(), path);
    return path;
  }

 private:
  const World& world_;
  std::string prefix_;
};

// The tenants of every GPU in the arbiter's status, by pid.
std::map<pid_t, nlohmann::json> tenants_by_pid(const World& world) {
  std::map<pid_t, nlohmann::json> out;
  const nlohmann::json status = world.admin({{"cmd", "status"}});
  for (const auto& gpu : status.value("gpus", nlohmann::json::array()))
    for (const auto& t : gpu.value("tenants", nlohmann::json::array())) out[t.value("pid", 0)] = t;
  return out;
}

bool all_connected(const World& world, const std::vector<pid_t>& pids) {
  const auto tenants = tenants_by_pid(world);
  for (pid_t pid : pids) {
    auto t = tenants.find(pid);
    if (t == tenants.end() || !t->second.value("connected", false)) return false;
  }
  return true;
}

// Each pid's share of the device time the given pids had within [from, to).
std::map<pid_t, double> shares(const World& world, const std::vector<pid_t>& pids, uint64_t from, uint64_t to) {
  const auto busy = busy_by_pid(read_sim_log(world.sim_log_path()), from, to);
  double total = 0;
  for (pid_t pid : pids) total += static_cast<double>(busy.count(pid) ? busy.at(pid) : 0);
  std::map<pid_t, double> out;
  for (pid_t pid : pids) out[pid] = total == 0 ? 0 : static_cast<double>(busy.count(pid) ? busy.at(pid) : 0) / total;
  return out;
}

void expect_shares(const World& world, const std::vector<std::pair<pid_t, double>>& expected, uint64_t from,
                   uint64_t to, const std::string& when) {
  std::vector<pid_t> pids;
  for (const auto& [pid, target] : expected) pids.push_back(pid);
  const auto got = shares(world, pids, from, to);
  std::cout << when << ":";
  for (const auto& [pid, target] : expected) std::cout << " pid " << pid << " " << got.at(pid) << " (weight's " << target << ")";
  std::cout << std::endl;
  for (const auto& [pid, target] : expected) {
    EXPECT_NEAR(got.at(pid) * 100, target * 100, 8.0)
        << when << ": pid " << pid << " got " << got.at(pid) << ", its weight's share is " << target;
  }
}

std::string error_lines(const std::string& log) {
  std::istringstream in(log);
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.find("[error]") != std::string::npos || line.find("[critical]") != std::string::npos) out += line + "\n";
  }
  return out;
}

// Lines of an arbiter log at error level or above, less those `expected` names.
std::string unexpected_errors(const std::string& log, const std::string& expected = "") {
  std::string out;
  std::istringstream lines(error_lines(log));
  for (std::string line; std::getline(lines, line);) {
    if (expected.empty() || line.find(expected) == std::string::npos) out += line + "\n";
  }
  return out;
}

bool unmanaged_on_gpu(const World& world, pid_t pid) {
  const nlohmann::json status = world.admin({{"cmd", "status"}});
  for (const auto& gpu : status.value("gpus", nlohmann::json::array()))
    for (const auto& u : gpu.value("unmanaged", nlohmann::json::array()))
      if (u.value("pid", 0) == pid) return true;
  return false;
}

TEST(Upgrade, PodsKeepSharesCapsAndLedgerAcrossAnUpgradeAndARollback) {
  ASSERT_TRUE(std::filesystem::exists(kPrevious + "/bin/quanta-arbiter"))
      << "the previous release is not built in " << kPrevious << " (tests/upgrade/build-previous.sh)";
  World world(test_name(), ArbiterConfig{.quantum = "10ms",
                                         .lease = "400ms",
                                         .pods = {{"heavy", 3, ""}, {"light", 1, ""}, {"capped", 1, "256Mi"},
                                                  {"fresh", 1, "256Mi"}}});
  Node node(world);
  node.install_previous();
  world.start_arbiter(kPrevious + "/bin/quanta-arbiter");

  // Pods of the previous release: two competing by weight 3:1, one holding memory under its cap.
  const Env overhead = {{"QUANTA_CONTEXT_OVERHEAD", "16Mi"}};
  auto pod_env = [&](const std::string& name) {
    Env env = overhead;
    env["LD_PRELOAD"] = node.container_library(name);
    return env;
  };
  const Env heavy_env = pod_env("heavy"), light_env = pod_env("light"), capped_env = pod_env("capped");
  const std::string at = start_in(600);
  const uint64_t started = monotonic_ns() + 600 * kMs;
  Child heavy = world.spawn_tenant(batch(28.0, at), "heavy", false, heavy_env);
  Child light = world.spawn_tenant(batch(28.0, at), "light", false, light_env);
  Child holder = world.spawn_tenant({"alloc", "--bytes", "64Mi", "--count", "2", "--hold-ms", "27000", "--start-at", at},
                                    "capped", false, capped_env);
  ASSERT_TRUE(eventually(10, [&] { return all_connected(world, {heavy.pid(), light.pid()}); }))
      << "the previous release's arbiter never gated its pods:\n" << world.arbiter_log();
  sleep_ms(3000);
  expect_shares(world, {{heavy.pid(), 0.75}, {light.pid(), 0.25}}, started + 500 * kMs, monotonic_ns(),
                "under the previous release");

  // The upgrade: the new image installs its files, then the arbiter's pod is replaced.
  const std::string installed = node.install_current();
  EXPECT_NE(installed.find("libquanta.so installed"), std::string::npos) << installed;
  world.kill_arbiter(SIGTERM);
  const uint64_t upgrading = monotonic_ns();
  world.start_arbiter();
  ASSERT_TRUE(eventually(10, [&] { return all_connected(world, {heavy.pid(), light.pid(), holder.pid()}); }))
      << "the previous release's pods were not re-attached by the new arbiter:\n" << world.arbiter_log();
  const uint64_t reattached = monotonic_ns();
  ::testing::Test::RecordProperty("upgrade_to_reattached_ms", std::to_string((reattached - upgrading) / kMs));
  for (const auto& [pid, t] : tenants_by_pid(world)) {
    EXPECT_EQ(t.value("shared_memory_layout", 0), 2) << "pid " << pid << " is not served in its own layout: " << t.dump();
  }
  // The ledger carried over: the holder's two 64 MiB and its 16 MiB context are still the pod's.
  EXPECT_EQ(tenants_by_pid(world).at(holder.pid()).value("pod_memory_used", 0ull), 144 * kMi);
  // The new arbiter re-adopts them across its own crash too.
  world.kill_arbiter(SIGKILL);
  world.start_arbiter();
  ASSERT_TRUE(eventually(10, [&] { return all_connected(world, {heavy.pid(), light.pid(), holder.pid()}); }))
      << "the new arbiter did not re-adopt the previous release's pods after a crash:\n" << world.arbiter_log();
  const uint64_t restarted = monotonic_ns();
  EXPECT_EQ(tenants_by_pid(world).at(holder.pid()).value("pod_memory_used", 0ull), 144 * kMi);
  EXPECT_EQ(world.arbiter_log().find("not usable"), std::string::npos) << world.arbiter_log();
  sleep_ms(3000);
  expect_shares(world, {{heavy.pid(), 0.75}, {light.pid(), 0.25}}, restarted + 500 * kMs, monotonic_ns(),
                "after the upgrade and a crash of the new arbiter");

  // The cap holds for a new process of the old capped pod (its container still maps the old
  // library): 256 MiB less the holder's 144 MiB and the racer's own 16 MiB context is 96 MiB.
  Child racer = world.spawn_tenant({"alloc", "--race", "--bytes", "16Mi", "--hold-ms", "300"}, "capped", false,
                                   capped_env);
  const nlohmann::json race = expect_clean_exit(racer, 30, "racer in the capped pod");
  EXPECT_EQ(race.value("oom", 0), 1) << race.dump();
  EXPECT_EQ(race.value("successes", 0), 6) << "96 MiB is six 16 MiB allocations: " << race.dump();

  // A pod started now gets this release, beside the old ones: 3:1:1.
  const Env fresh_env = pod_env("fresh");
  const uint64_t fresh_at = monotonic_ns() + 500 * kMs;
  Child fresh = world.spawn_tenant(batch(11.0, start_in(500)), "fresh", false, fresh_env);
  // Its second process allocates only after the rollback below, against the cap this release set.
  const std::string after_rollback = start_in(7500);
  Child fresh_alloc = world.spawn_tenant(
      {"alloc", "--bytes", "16Mi", "--count", "20", "--hold-ms", "500", "--start-at", after_rollback}, "fresh", false,
      fresh_env);
  ASSERT_TRUE(eventually(10, [&] { return all_connected(world, {fresh.pid()}); })) << world.arbiter_log();
  EXPECT_EQ(tenants_by_pid(world).at(fresh.pid()).value("shared_memory_layout", 0), 3);
  sleep_ms(4000);
  expect_shares(world, {{heavy.pid(), 0.6}, {light.pid(), 0.2}, {fresh.pid(), 0.2}}, fresh_at + 500 * kMs,
                monotonic_ns(), "old and new pods together");
  EXPECT_EQ(unexpected_errors(world.arbiter_log()), "") << "the new arbiter logged errors";

  // The rollback: the previous release's files and arbiter again. Its pods stay gated and
  // capped; the pod started under this release cannot be placed by it and says so.
  world.kill_arbiter(SIGTERM);
  node.install_previous();
  world.start_arbiter(kPrevious + "/bin/quanta-arbiter");
  ASSERT_TRUE(eventually(10, [&] { return all_connected(world, {heavy.pid(), light.pid(), holder.pid()}); }))
      << "the rolled-back arbiter did not keep the previous release's pods:\n" << world.arbiter_log();
  const uint64_t rolled_back = monotonic_ns();
  const std::string old_log = world.arbiter_log();
  EXPECT_EQ(old_log.find("previous control region of GPU 0 is not usable"), std::string::npos)
      << "the layout-2 control region was not recorded for the rollback:\n" << old_log;
  EXPECT_TRUE(eventually(10, [&] { return unmanaged_on_gpu(world, fresh.pid()); }))
      << "the rolled-back arbiter does not count the new release's pod as unmanaged";
  sleep_ms(3000);
  expect_shares(world, {{heavy.pid(), 0.75}, {light.pid(), 0.25}}, rolled_back + 500 * kMs, monotonic_ns(),
                "after the rollback");

  const nlohmann::json fresh_allocs = expect_clean_exit(fresh_alloc, 30, "the new release's allocating process");
  EXPECT_EQ(fresh_allocs.value("successes", 0), 14)
      << "256 MiB less two 16 MiB contexts is fourteen 16 MiB allocations: " << fresh_allocs.dump();
  expect_clean_exit(fresh, 30, "the new release's pod");
  EXPECT_NE(fresh.err().find("does not place this process again"), std::string::npos) << fresh.err();
  expect_clean_exit(heavy, 60, "heavy pod of the previous release");
  expect_clean_exit(light, 60, "light pod of the previous release");
  const nlohmann::json held = expect_clean_exit(holder, 60, "capped pod of the previous release");
  EXPECT_EQ(held.value("successes", 0), 2) << held.dump();
  EXPECT_EQ(unexpected_errors(world.arbiter_log(), "not re-adopting the region of pod fresh"), "")
      << "the rolled-back arbiter logged errors beyond the new release's pod";
}

}  // namespace
}  // namespace quanta::integration
