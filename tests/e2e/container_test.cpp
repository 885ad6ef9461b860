// Pods get Quanta with no change to their images: real runc and crun start containers from
// the generated CDI spec's edits and quanta-hook, in an image without libstdc++, on simgpu.
// Verdicts come from what Quanta does not write itself: simgpu's execution log, the
// containers' own reports, /proc of their processes, and the runtimes' exit codes and
// messages; the arbiter's status and state file say how it saw them.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "tests/e2e/containers.h"

namespace quanta::e2e {
namespace {

using integration::ArbiterConfig;
using integration::eventually;
using integration::monotonic_ns;
using integration::realtime_ns;
using nlohmann::json;

constexpr uint64_t kMs = 1000000ull;
constexpr uint64_t kMi = 1ull << 20;

std::string test_name() {
  std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::replace(name.begin(), name.end(), '/', '_');
  return name;
}

std::string start_in(double ms) { return std::to_string(realtime_ns() + static_cast<int64_t>(ms * 1e6)); }

// Sockets where a node has them (one folder), no unregistered processes, the per-context
// charge `overhead` (0 keeps the ledger arithmetic plain), and a short hook timeout.
ArbiterConfig node_config(const std::string& overhead = "0") {
  ArbiterConfig c;
  c.allow_unregistered = false;
  c.quantum = "10ms";
  c.sockets_in_run_dir = true;
  c.extra = "[shim]\ncontext_overhead = \"" + overhead + "\"\n[hook]\ntimeout = \"2s\"\n";
  return c;
}

std::string id_for(const std::string& what, Runtime r) {
  return "qe2e-" + std::to_string(getpid()) + "-" + what + "-" + runtime_name(r);
}

class ContainerTest : public RuntimeTest {
 protected:
  // A world, Quanta installed into it, the vendor's stand-in spec, and the runtime.
  void start(const std::string& overhead = "0") {
    overhead_ = overhead;
    world_ = std::make_unique<World>(test_name(), node_config(overhead));
    world_->start_arbiter();
    install_ = install_quanta(*world_);
    vendor_ = vendor_spec(*world_);
    containers_ = std::make_unique<Containers>(*world_, GetParam());
  }

  // The container with Quanta's device quanta.dev/gpu=0 beside the vendor's GPU 0.
  std::string bundle(ContainerSpec c, const std::vector<std::string>& quanta_devices = {"0"}) {
    // The shim takes the context charge from the arbiter's Welcome where it does, and from
    // QUANTA_CONTEXT_OVERHEAD where it does not yet: both say the same.
    c.env.push_back("QUANTA_CONTEXT_OVERHEAD=" + overhead_);
    return containers_->write_bundle(
        c, containers_->config_for(c, {{&vendor_, {"0"}}, {&install_.spec, quanta_devices}}));
  }

  Child run(const ContainerSpec& c) { return containers_->run(c.id, bundle(c)); }

  // Waits until the pod has `n` tenants in the arbiter's status; returns them.
  std::vector<json> admitted(const std::string& pod, size_t n = 1, double timeout_s = 20) {
    std::vector<json> tenants;
    eventually(timeout_s, [&] { return (tenants = tenants_of(status(*world_), pod)).size() >= n; });
    return tenants;
  }

  std::string log_tail() const { return world_->arbiter_log(); }

  std::string overhead_ = "0";
  std::unique_ptr<World> world_;
  Install install_;
  json vendor_;
  std::unique_ptr<Containers> containers_;
};

json report_of(Child& c, double timeout_s, const std::string& what) {
  const int code = c.wait(timeout_s);
  EXPECT_EQ(code, 0) << what << " exited " << code << "; runtime and hook stderr:\n" << c.err() << "\nstdout:\n" << c.out();
  json r = json::parse(c.out(), nullptr, false);
  EXPECT_TRUE(r.is_object() && r.value("ok", false)) << what << " report: " << c.out() << "\nstderr:\n" << c.err();
  return r;
}

TEST_P(ContainerTest, AnnotatedContainerRegistersAsItsPodIsGatedAndCapped) {
  start();
  const std::string uuid = gpu0_uuid(*world_);
  ASSERT_FALSE(uuid.empty());
  ContainerSpec c;
  c.id = id_for("web", GetParam());
  c.pod = "web";
  c.pod_namespace = "prod";
  c.container_name = "server";
  c.annotations = {{"quanta.dev/weight", "2"}, {"quanta.dev/memory-limit", "1Gi"}};
  c.own_pid_namespace = true;
  c.args = {"/bin/quanta-tenant", "--json", "batch", "--seconds", "3", "--kernel-ms", "2"};
  Child batch = run(c);

  std::vector<json> tenants = admitted("prod/web");
  ASSERT_EQ(tenants.size(), 1u) << "the container's process never reached the arbiter as prod/web;\n"
                                << batch.err() << "\narbiter log:\n" << log_tail();
  const json& t = tenants[0];
  EXPECT_EQ(t["weight"], 2);
  EXPECT_EQ(t["memory_cap"].get<uint64_t>(), 1024 * kMi);
  const pid_t host_pid = t["pid"].get<pid_t>();
  EXPECT_EQ(host_pid, containers_->pid_of(c.id)) << "the arbiter placed another process than the container's";

  // What the runtime gave the process: libquanta.so preloaded through /etc/ld.so.preload,
  // no C++ runtime anywhere in it (the image has none).
  const std::string maps = read_file("/proc/" + std::to_string(host_pid) + "/maps");
  EXPECT_NE(maps.find("/opt/quanta/lib/libquanta.so"), std::string::npos) << maps;
  EXPECT_EQ(maps.find("libstdc++"), std::string::npos) << maps;
  EXPECT_EQ(maps.find("libgcc_s"), std::string::npos) << maps;

  // The registration as the hook sent it.
  const json regs = registrations(*world_);
  const json* r = registration(regs, c.id);
  ASSERT_NE(r, nullptr) << regs.dump(2);
  EXPECT_EQ((*r)["pod_name"], "web");
  EXPECT_EQ((*r)["pod_namespace"], "prod");
  EXPECT_EQ((*r)["pod_uid"], "uid-web");
  EXPECT_EQ((*r)["container_name"], "server");
  EXPECT_EQ((*r)["devices"], json::array({uuid}));
  const std::string cgroup = (*r)["cgroup_path"].get<std::string>();
  EXPECT_NE(cgroup, "/");
  EXPECT_NE(read_file("/proc/" + std::to_string(host_pid) + "/cgroup").find(cgroup),
            std::string::npos);

  // Gated: its launches wait for grants the arbiter hands out.
  EXPECT_TRUE(eventually(10, [&] {
    const std::vector<json> now = tenants_of(status(*world_), "prod/web");
    return !now.empty() && now[0].value("grants", 0) > 0 && now[0].value("launches", 0) > 0;
  })) << status(*world_).dump(2);

  const json report = report_of(batch, 60, "the batch container");
  EXPECT_GT(report.value("kernels", 0), 50);
  EXPECT_EQ(registration(registrations(*world_), c.id), nullptr) << "poststop left the registration behind";

  // A second container of the pod allocates against the pod's 1Gi cap.
  ContainerSpec a = c;
  a.id = id_for("web-alloc", GetParam());
  a.container_name = "allocator";
  a.args = {"/bin/quanta-tenant", "--json", "alloc", "--bytes", "400Mi", "--count", "3"};
  Child alloc = run(a);
  const json ar = report_of(alloc, 60, "the allocating container");
  EXPECT_EQ(ar.value("successes", -1), 2) << ar.dump();
  EXPECT_EQ(ar.value("oom", -1), 1) << "the third 400Mi must meet the 1Gi cap: " << ar.dump();
}

TEST_P(ContainerTest, PodsWeightedOneToThreeGetShares25And75FromTheExecutionLog) {
  start();
  const std::string at = start_in(2500);
  auto spec = [&](const std::string& pod, const std::string& weight) {
    ContainerSpec c;
    c.id = id_for(pod, GetParam());
    c.pod = pod;
    c.annotations = {{"quanta.dev/weight", weight}};
    c.args = {"/bin/quanta-tenant", "--json", "batch", "--seconds", "4", "--kernel-ms", "2", "--depth", "2",
              "--start-at", at};
    return c;
  };
  Child light = run(spec("light", "1"));
  Child heavy = run(spec("heavy", "3"));
  const json lr = report_of(light, 90, "weight 1");
  const json hr = report_of(heavy, 90, "weight 3");
  const pid_t pids[] = {lr.value("pid", 0), hr.value("pid", 0)};

  const Shares shares = shares_from_log(world_->sim_log_path(), {pids[0], pids[1]}, 300 * kMs);
  ASSERT_TRUE(shares.ok) << shares.why;
  ASSERT_GT(shares.to_ns, shares.from_ns + 1500 * kMs) << "the two containers overlapped for less than 1.5 s";
  const double l = static_cast<double>(shares.busy_ns.at(pids[0]));
  const double h = static_cast<double>(shares.busy_ns.at(pids[1]));
  ASSERT_GT(l + h, 0);
  EXPECT_NEAR(100 * l / (l + h), 25.0, 5.0) << "weight 1 got " << l / (l + h);
  EXPECT_NEAR(100 * h / (l + h), 75.0, 5.0) << "weight 3 got " << h / (l + h);
}

TEST_P(ContainerTest, SecondContainerOfAPodSharesItsLedger) {
  start();
  ContainerSpec holder;
  holder.id = id_for("holder", GetParam());
  holder.pod = "ledger";
  holder.container_name = "holder";
  holder.annotations = {{"quanta.dev/memory-limit", "1Gi"}};
  holder.args = {"/bin/quanta-tenant", "--json", "alloc", "--bytes", "600Mi", "--count", "1", "--hold-ms", "8000"};
  Child h = run(holder);
  int index = -1;
  ASSERT_TRUE(eventually(20, [&] {
    index = integration::find_pod_region(*world_, "e2e/ledger");
    if (index < 0) return false;
    integration::PodView view(*world_, static_cast<uint32_t>(index));
    return view.ok() && view->memory_used[0].load() == 600 * kMi;
  })) << "the holder never had 600Mi in its pod's ledger;\n" << h.err() << "\n" << log_tail();

  ContainerSpec second = holder;
  second.id = id_for("second", GetParam());
  second.container_name = "second";
  second.args = {"/bin/quanta-tenant", "--json", "alloc", "--bytes", "600Mi", "--count", "1"};
  Child s = run(second);
  const json sr = report_of(s, 60, "the second container");
  EXPECT_EQ(sr.value("oom", -1), 1) << "600Mi + 600Mi passed the pod's 1Gi cap: " << sr.dump();
  EXPECT_EQ(sr.value("successes", -1), 0) << sr.dump();
  integration::PodView view(*world_, static_cast<uint32_t>(index));
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->memory_used[0].load(), 600 * kMi) << "the denied allocation changed the ledger";
  const json hr = report_of(h, 60, "the holder");
  EXPECT_EQ(hr.value("successes", -1), 1);
}

TEST_P(ContainerTest, InvalidOrUnknownAnnotationRefusesTheContainerWithTheMessage) {
  start();
  const std::pair<std::string, std::string> bad[] = {
      {"quanta.dev/weight", "0"},
      {"quanta.dev/wieght", "4"},
  };
  for (const auto& [key, value] : bad) {
    ContainerSpec c;
    c.id = id_for(key.substr(11) + "-refused", GetParam());
    c.pod = "refused";
    c.annotations = {{key, value}};
    c.args = {"/bin/quanta-tenant", "--json", "info"};
    Child r = run(c);
    const int code = r.wait(60);
    EXPECT_NE(code, 0) << "the runtime started a container annotated " << key << "=" << value;
    // runc quotes the hook's stderr Go-style (\"); read it as the hook wrote it.
    std::string err = r.err() + containers_->hook_stderr(c.id);
    for (size_t at; (at = err.find("\\\"")) != std::string::npos;) err.erase(at, 1);
    EXPECT_NE(err.find("quanta-hook: annotation " + key + " = \"" + value + "\" is refused"), std::string::npos) << err;
    EXPECT_NE(err.find(key == "quanta.dev/weight" ? "use a whole number from 1 to 1000" : "allowed keys are weight"),
              std::string::npos)
        << err;
    EXPECT_TRUE(r.out().empty()) << "the container ran: " << r.out();
    EXPECT_EQ(registration(registrations(*world_), c.id), nullptr);
  }
}

TEST_P(ContainerTest, KilledContainerReturnsItsMemoryAndGrant) {
  start("256Mi");
  auto spec = [&](const std::string& pod) {
    ContainerSpec c;
    c.id = id_for(pod, GetParam());
    c.pod = pod;
    c.annotations = {{"quanta.dev/memory-limit", "2Gi"}};
    c.args = {"/bin/quanta-tenant", "--json", "batch", "--seconds", "30", "--kernel-ms", "5"};
    return c;
  };
  const ContainerSpec victim = spec("victim"), survivor = spec("survivor");
  Child v = run(victim);
  Child s = run(survivor);
  ASSERT_EQ(admitted("e2e/victim").size(), 1u) << v.err() << log_tail();
  ASSERT_EQ(admitted("e2e/survivor").size(), 1u) << s.err() << log_tail();
  const int index = integration::find_pod_region(*world_, "e2e/victim");
  ASSERT_GE(index, 0);
  {
    integration::PodView view(*world_, static_cast<uint32_t>(index));
    ASSERT_TRUE(eventually(10, [&] { return view.ok() && view->memory_used[0].load() == 256 * kMi; }))
        << "the victim's context is not in its pod's ledger";
  }
  const pid_t survivor_pid = admitted("e2e/survivor")[0]["pid"].get<pid_t>();

  ASSERT_EQ(containers_->kill(victim.id), 0);
  EXPECT_GE(v.wait(30), 0) << "runc run did not return after the kill";
  EXPECT_TRUE(eventually(10, [&] { return tenants_of(status(*world_), "e2e/victim").empty(); }))
      << "the arbiter still lists the killed container's process";
  {
    integration::PodView view(*world_, static_cast<uint32_t>(index));
    EXPECT_TRUE(!view.ok() || view->memory_used[0].load() == 0) << "the killed pod's memory was not returned";
  }
  // The GPU is the survivor's alone now: it holds it within a generous bound.
  EXPECT_TRUE(eventually(5, [&] {
    const json st = status(*world_);
    return st.contains("gpus") && !st["gpus"][0]["holder"].is_null() && st["gpus"][0]["holder"]["pid"] == survivor_pid;
  })) << status(*world_).dump(2);
  EXPECT_EQ(registration(registrations(*world_), victim.id), nullptr) << "poststop did not unregister the killed container";
  containers_->kill(survivor.id);
  s.wait(30);
}

// The admin socket is in a folder no container mounts; where an operator put it beside the
// tenant socket anyway, the socket itself still refuses a caller inside a container.
TEST_P(ContainerTest, ContainerCannotSeeOrUseTheAdminSocket) {
  start();
  ContainerSpec c;
  c.id = id_for("probe", GetParam());
  c.pod = "probe";
  c.annotations = {{"quanta.dev/weight", "1"}};
  c.own_pid_namespace = true;
  c.args = {"/bin/admin-probe", "/run/quanta/admin.sock"};
  Child p = run(c);
  EXPECT_EQ(p.wait(60), 2) << "the admin socket is visible in the container: " << p.out() << p.err();

  // The old layout, admin socket beside the tenant socket: visible, and refused.
  const std::string beside = std::filesystem::path(world_->tenant_socket()).parent_path().string() + "/admin.sock";
  std::filesystem::create_hard_link(world_->admin_socket(), beside);  // the same socket
  ContainerSpec b = c;
  b.id = id_for("probe-beside", GetParam());
  Child q = run(b);
  EXPECT_EQ(q.wait(60), 0) << q.err();
  EXPECT_NE(q.out().find("\"ok\":false"), std::string::npos) << q.out();
  EXPECT_NE(q.out().find("outside containers"), std::string::npos) << q.out();
}

TEST_P(ContainerTest, TransparentFormGatesAPodThatAsksForNvidiasDeviceOnly) {
  start();
  // The vendor's spec with GPU 0's device node, taken over: the container names only the
  // vendor's device, as a pod using NVIDIA's device plugin or DRA driver does.
  vendor_ = vendor_spec(*world_, "nvidia.com/gpu", /*device_nodes=*/true);
  const std::string vendor_path = world_->dir().file("etc-cdi/nvidia.json");
  std::filesystem::create_directories(world_->dir().file("etc-cdi"));
  {
    std::ofstream(vendor_path) << vendor_.dump(2);
  }
  const std::string spec_dirs = world_->dir().file("etc-cdi") + "," + world_->dir().file("run-cdi");
  std::filesystem::create_directories(world_->dir().file("run-cdi"));
  Install takeover = install_quanta(*world_, {"--take-over", vendor_path, "--spec-dirs", spec_dirs}, "run-cdi/nvidia-quanta.json");
  ContainerSpec c;
  c.id = id_for("transparent", GetParam());
  c.pod = "plain";
  c.annotations = {{"quanta.dev/weight", "5"}};
  c.args = {"/bin/quanta-tenant", "--json", "batch", "--seconds", "2", "--kernel-ms", "2"};
  c.env.push_back("QUANTA_CONTEXT_OVERHEAD=0");
  const json config = containers_->config_for(c, {{&takeover.spec, {"0"}}});
  Child b = containers_->run(c.id, containers_->write_bundle(c, config));
  std::vector<json> tenants = admitted("e2e/plain");
  ASSERT_EQ(tenants.size(), 1u) << b.err() << log_tail();
  EXPECT_EQ(tenants[0]["weight"], 5);
  const json regs = registrations(*world_);
  const json* r = registration(regs, c.id);
  ASSERT_NE(r, nullptr) << regs.dump(2);
  EXPECT_EQ((*r)["devices"], json::array({gpu0_uuid(*world_)})) << "derived from /dev/nvidia0 and the marker";
  report_of(b, 60, "the transparent container");
}

TEST_P(ContainerTest, ArbiterDownRefusesCappedPodsAndStartsOthersUngated) {
  start();
  world_->kill_arbiter(SIGTERM);
  ContainerSpec capped;
  capped.id = id_for("capped-down", GetParam());
  capped.pod = "capped";
  capped.annotations = {{"quanta.dev/memory-limit", "1Gi"}};
  capped.args = {"/bin/quanta-tenant", "--json", "info"};
  Child c = run(capped);
  EXPECT_NE(c.wait(60), 0) << "a capped pod started while Quanta could not cap it";
  const std::string err = c.err() + containers_->hook_stderr(capped.id);
  EXPECT_NE(err.find("closed-if-capped"), std::string::npos) << err;
  EXPECT_NE(err.find("asked for a memory limit"), std::string::npos) << err;

  ContainerSpec open = capped;
  open.id = id_for("open-down", GetParam());
  open.pod = "open";
  open.annotations = {{"quanta.dev/weight", "2"}};
  Child o = run(open);
  report_of(o, 60, "an uncapped pod with the arbiter down");
  if (GetParam() == Runtime::kCrun) {  // runc shows a hook's stderr only when it fails
    EXPECT_NE(containers_->hook_stderr(open.id).find("starts ungated and uncapped"), std::string::npos)
        << containers_->hook_stderr(open.id);
  }
}

INSTANTIATE_TEST_SUITE_P(Runtimes, ContainerTest, ::testing::Values(Runtime::kRunc, Runtime::kCrun),
                         [](const ::testing::TestParamInfo<Runtime>& info) { return std::string(runtime_name(info.param)); });

}  // namespace
}  // namespace quanta::e2e
