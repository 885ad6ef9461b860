// The command-line tools as an operator meets them: every tool names its release with
// --version and exits 2 on a usage error; quantactl says what to check when it cannot reach
// the arbiter, refuses to change a pod the arbiter does not know, shows where each policy
// value came from and removes overrides; `top` writes no screen control into a file or
// pipe; durations take one grammar; a shim with no arbiter says so at the default level.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <regex>
#include <string>
#include <vector>

#include "common/version.h"
#include "tests/integration/harness.h"

namespace quanta::integration {
namespace {

using nlohmann::json;

struct ToolRun {
  int code = -1;
  std::string out;
  std::string err;
};

ToolRun run(World& world, const std::vector<std::string>& argv, double timeout_s = 20) {
  Child child = world.spawn(argv, world.tenant_env("", false));
  ToolRun r;
  r.code = child.wait(timeout_s);
  r.out = child.out();
  r.err = child.err();
  return r;
}

ToolRun quantactl(World& world, std::vector<std::string> args) {
  args.insert(args.begin(), {QUANTACTL_BINARY, "--admin-socket", world.admin_socket()});
  return run(world, args);
}

TEST(Tools, EveryToolNamesItsReleaseAndInterfacesAndAUsageErrorExitsTwo) {
  World world("tools-version");
  const std::regex line(
      "([a-z-]+) [0-9]+\\.[0-9]+\\.[0-9]+ \\(shared-memory layout [0-9]+, tenant protocol "
      "[0-9]+\\)\n");
  std::vector<std::pair<std::string, std::string>> tools = {
      {QUANTA_ARBITER_BINARY, "quanta-arbiter"}, {QUANTACTL_BINARY, "quantactl"}};
#ifdef QUANTA_TRACE_BINARY
  tools.emplace_back(QUANTA_TRACE_BINARY, "quanta-trace");
#endif
  for (const auto& [binary, name] : tools) {
    const ToolRun version = run(world, {binary, "--version"});
    EXPECT_EQ(version.code, 0) << name << ": " << version.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_match(version.out, m, line)) << name << ": " << version.out;
    EXPECT_EQ(m[1], name);
    const ToolRun usage = run(world, {binary, "--no-such-option"});
    EXPECT_EQ(usage.code, 2) << name << ": " << usage.err;
  }
}

TEST(Tools, StatusSaysWhichVersionsTheArbiterSpeaksAndAccepts) {
  World world("tools-versions", ArbiterConfig{.pods = {}});
  world.start_arbiter();
  const ToolRun table = quantactl(world, {"status"});
  ASSERT_EQ(table.code, 0) << table.err;
  const std::regex line(
      R"(\nrelease [0-9]+\.[0-9]+\.[0-9]+: tenant protocol ([0-9]+) \(accepts [0-9]+( to )"
      R"([0-9]+)?\), shared-memory layout ([0-9]+) \(accepts [0-9]+( to [0-9]+)?\)\n)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(table.out, m, line)) << table.out;
  EXPECT_EQ(m[1], std::to_string(common::kWireVersion));
  EXPECT_EQ(m[3], std::to_string(common::kLayoutVersion));
  const ToolRun raw = quantactl(world, {"status", "--json"});
  ASSERT_EQ(raw.code, 0) << raw.err;
  const json versions = json::parse(raw.out).at("versions");
  EXPECT_EQ(versions.at("tenant_protocol").at("speaks"), common::kWireVersion);
  EXPECT_EQ(versions.at("shared_memory_layout").at("speaks"), common::kLayoutVersion);
  const json accepts = versions.at("tenant_protocol").at("accepts");
  ASSERT_EQ(accepts.size(), 2u);
  EXPECT_LE(accepts[0].get<uint32_t>(), common::kWireVersion);
  EXPECT_GE(accepts[1].get<uint32_t>(), common::kWireVersion);
}

// No arbiter behind the path, then a socket whose arbiter is gone: each error says which
// and what to do, and neither hangs.
TEST(Tools, QuantactlSaysWhatToCheckWhenItCannotReachTheArbiter) {
  World world("tools-unreachable");
  ToolRun r = quantactl(world, {"status"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("cannot reach quanta-arbiter at " + world.admin_socket()), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("no such socket"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--admin-socket or QUANTA_ADMIN_SOCKET"), std::string::npos) << r.err;

  // A socket file nobody listens on: what an arbiter killed with SIGKILL leaves.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", world.admin_socket().c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ::close(fd);
  r = quantactl(world, {"status"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("nothing listens there"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("see its log"), std::string::npos) << r.err;
}

// A pod the arbiter does not know is refused; a running pod's override shows as its source,
// is listed, can be removed key by key, and is forgotten when the pod is gone.
TEST(Tools, OverridesApplyToKnownPodsShowTheirSourceAndCanBeRemoved) {
  ArbiterConfig config;
  config.pods = {{"tools/tabled", 3, ""}, {"other/api", 1, ""}, {"tools/api", 1, ""}};
  World world("tools-policy", config);
  world.start_arbiter();

  ToolRun r = quantactl(world, {"set", "tools/ghost", "weight=5"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("pod tools/ghost is not known to this arbiter"), std::string::npos) << r.err;
  r = quantactl(world, {"policy"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("no live overrides"), std::string::npos) << "nothing was kept: " << r.out;
  r = quantactl(world, {"policy", "api"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("pod name api is ambiguous: other/api, tools/api"), std::string::npos) << r.err;

  r = quantactl(world, {"policy", "tools/tabled", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json tabled = json::parse(r.out);
  EXPECT_EQ(tabled["values"][0], json({{"key", "weight"}, {"value", "3"}, {"source", "node table"}}));
  EXPECT_EQ(tabled["values"][1]["source"], "default");

  Child tenant = world.spawn_tenant({"batch", "--seconds", "3", "--kernel-ms", "1"}, "tools/run", true);
  ASSERT_TRUE(eventually(10, [&] { return world.connected_pids().count(tenant.pid()) != 0; }));
  r = quantactl(world, {"set", "tools/run", "weight=5", "max-share=50%"});
  ASSERT_EQ(r.code, 0) << r.err;
  r = quantactl(world, {"policy", "tools/run"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("weight +5 +override\n"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("max-share +0\\.5 +override\n"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("priority +batch +default\n"))) << r.out;
  r = quantactl(world, {"policy"});
  EXPECT_NE(r.out.find("tools/run max-share=50% weight=5"), std::string::npos) << r.out;

  r = quantactl(world, {"unset", "tools/run", "quantum"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("has no live quantum override; it has: max-share, weight"), std::string::npos)
      << r.err;
  // Every command names a pod the same way: by its name alone when no other pod has it.
  r = quantactl(world, {"policy", "run", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["pod"], "tools/run");
  r = quantactl(world, {"set", "tabled", "priority=best-effort"});
  ASSERT_EQ(r.code, 0) << r.err;
  r = quantactl(world, {"unset", "tabled"});
  ASSERT_EQ(r.code, 0) << r.err;
  r = quantactl(world, {"explain", "run", "--last", "2s"});
  EXPECT_EQ(r.code, 0) << r.err;
  r = quantactl(world, {"explain", "run", "--last", "2 minutes"});
  EXPECT_EQ(r.code, 2) << "a bad duration is a usage error";
  EXPECT_NE(r.err.find("--last"), std::string::npos) << r.err;

  r = quantactl(world, {"unset", "run", "weight"});
  ASSERT_EQ(r.code, 0) << r.err;
  const json after = world.admin({{"cmd", "policy"}, {"pod", "tools/run"}});
  EXPECT_EQ(after["values"][0], json({{"key", "weight"}, {"value", "1"}, {"source", "default"}}));
  EXPECT_EQ(after["values"][3]["source"], "override") << "max-share stays";

  ASSERT_EQ(tenant.wait(30), 0) << tenant.err();
  EXPECT_TRUE(eventually(5, [&] { return world.admin({{"cmd", "policy"}})["overrides"].empty(); }))
      << "the pod is gone, and so is its override: "
      << world.admin({{"cmd", "policy"}}).dump();
}

TEST(Tools, TopWritesFramesWithoutScreenControlWhenItsOutputIsNotATerminal) {
  World world("tools-top");
  world.start_arbiter();
  Child top = world.spawn({QUANTACTL_BINARY, "--admin-socket", world.admin_socket(), "top",
                           "--interval", "200ms"},
                          world.tenant_env("", false));
  sleep_ms(1500);
  top.signal(SIGTERM);
  EXPECT_EQ(top.wait(10), 0) << top.err();
  const std::string out = top.out();
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << "screen control in a file: " << out;
  size_t frames = 0;
  for (size_t at = out.find("quantactl top:"); at != std::string::npos;
       at = out.find("quantactl top:", at + 1))
    ++frames;
  EXPECT_GE(frames, 3u) << out;
}

// Durations on the command line: seconds, or a number with a unit, the same on every tool.
TEST(Tools, DurationsTakeOneGrammarOnEveryTool) {
  World world("tools-durations");
  ToolRun r;
#ifdef QUANTA_TRACE_BINARY
  r = run(world, {QUANTA_TRACE_BINARY, "session", "--duration", "2 weeks"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("a number with a unit ns, us, ms, s, m or h"), std::string::npos) << r.err;
  EXPECT_LT(r.err.size(), 600u) << "one short line: " << r.err;
#endif
  world.start_arbiter();
  r = quantactl(world, {"drain", "0", "--timeout", "2 weeks"});
  EXPECT_EQ(r.code, 2) << "a bad duration is a usage error, as on quanta-trace";
  EXPECT_NE(r.err.find("a number with a unit ns, us, ms, s, m or h"), std::string::npos) << r.err;
  r = quantactl(world, {"top", "--once", "--interval", "5ms"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("outside 100ms to 60s"), std::string::npos) << r.err;
  r = quantactl(world, {"drain", "0", "--timeout", "1.5s"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(quantactl(world, {"undrain", "0"}).code, 0);
}

// Without an arbiter the shim runs ungated: a preloaded process says so once on stderr at
// the default log level, instead of silently running unmanaged.
TEST(Tools, AShimWithNoArbiterSaysItRunsUngatedAtTheDefaultLevel) {
  World world("tools-no-arbiter");
  Child tenant =
      world.spawn_tenant({"batch", "--seconds", "1", "--kernel-ms", "1"}, "tools/alone", true);
  ASSERT_EQ(tenant.wait(30), 0) << tenant.err();
  const std::string err = tenant.err();
  const size_t at = err.find("no arbiter at " + world.tenant_socket());
  EXPECT_NE(at, std::string::npos) << err;
  EXPECT_NE(err.find("running ungated and uncapped"), std::string::npos) << err;
  EXPECT_EQ(err.find("no arbiter at", at + 1), std::string::npos) << "said once: " << err;
}

}  // namespace
}  // namespace quanta::integration
