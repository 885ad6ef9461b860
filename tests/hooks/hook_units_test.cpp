// quanta-hook's pure parts: OCI state and bundle parsing, pod identity, annotation
// validation (and the docs' table held to the parser), the cgroup rule, device derivation,
// CDI spec building and versions, YAML, and the settings files.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "common/cgroup.h"
#include "hooks/annotations.h"
#include "hooks/bundle.h"
#include "hooks/cdi_spec.h"
#include "hooks/cgroup.h"
#include "hooks/commands.h"
#include "hooks/devices.h"
#include "hooks/error.h"
#include "hooks/layout.h"
#include "hooks/oci_state.h"
#include "hooks/pod_identity.h"
#include "hooks/spec_io.h"

namespace quanta::hooks {
namespace {

using nlohmann::json;

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const HookError& e) {
    return e.what();
  }
  return "(no error)";
}

// --- OCI state ---------------------------------------------------------------------------

TEST(OciState, ParsesWhatRuntimesWrite) {
  OciState s = parse_oci_state(
      R"({"ociVersion":"1.0.2","id":"abc","status":"creating","pid":4242,"bundle":"/run/b","annotations":{"k":"v"}})");
  EXPECT_EQ(s.id, "abc");
  EXPECT_EQ(s.pid, 4242);
  EXPECT_EQ(s.bundle, "/run/b");
  EXPECT_EQ(s.annotations.at("k"), "v");
  // crun's createContainer state: pid 0 and its own "root" field.
  s = parse_oci_state(R"({"ociVersion":"1.0","id":"x","pid":0,"root":"rootfs","bundle":"/b","status":"created"})");
  EXPECT_EQ(s.pid, 0);
  // poststop: no pid at all.
  EXPECT_EQ(parse_oci_state(R"({"id":"x","bundle":"/b","status":"stopped"})").pid, 0);
}

TEST(OciState, MalformedStateIsOneClearLine) {
  EXPECT_NE(error_of([] { parse_oci_state("{"); }).find("the OCI state on stdin is not valid JSON"), std::string::npos);
  EXPECT_NE(error_of([] { parse_oci_state("[1]"); }).find("not a JSON object"), std::string::npos);
  EXPECT_NE(error_of([] { parse_oci_state(R"({"bundle":"/b"})"); }).find("has no \"id\" string"), std::string::npos);
  EXPECT_NE(error_of([] { parse_oci_state(R"({"id":"a","bundle":"b"})"); }).find("absolute path"), std::string::npos);
  EXPECT_NE(error_of([] { parse_oci_state(R"({"id":"a","bundle":"/b","pid":-4})"); }).find("pid is \"-4\""),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_oci_state(R"({"id":"a/b","bundle":"/b"})"); }).find("without '/'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_oci_state(R"({"id":"a","bundle":"/b","annotations":{"k":1}})"); }).find("expected a string"),
            std::string::npos);
}

// --- bundle --------------------------------------------------------------------------------

TEST(Bundle, ReadsRootEnvMountsDevicesAndRules) {
  BundleConfig c = parse_bundle_config(R"({
    "root": {"path": "rootfs", "readonly": true},
    "process": {"env": ["A=1", "NVIDIA_VISIBLE_DEVICES=0", "A=2", "junk"]},
    "annotations": {"quanta.dev/weight": "3"},
    "mounts": [{"destination": "/proc", "type": "proc"}],
    "linux": {"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
              "resources": {"devices": [{"allow": false, "access": "rwm"},
                                        {"allow": true, "type": "c", "major": 195, "minor": 1, "access": "rw"}]}}
  })",
                                       "/run/bundle");
  EXPECT_EQ(c.root_path, "/run/bundle/rootfs");
  EXPECT_TRUE(c.root_readonly);
  EXPECT_EQ(c.env.at("A"), "2") << "the last of a repeated name wins, as in execve";
  EXPECT_EQ(c.annotations.at("quanta.dev/weight"), "3");
  ASSERT_EQ(c.mount_destinations.size(), 1u);
  ASSERT_EQ(c.devices.size(), 1u);
  EXPECT_EQ(c.devices[0].minor, 0);
  ASSERT_EQ(c.device_rules.size(), 2u);
  EXPECT_EQ(c.device_rules[0].major, -1) << "absent fields mean any";
  EXPECT_EQ(c.device_rules[1].minor, 1);
  EXPECT_EQ(parse_bundle_config(R"({"root":{"path":"/abs"}})", "/b").root_path, "/abs");
}

TEST(Bundle, MalformedConfigNamesTheField) {
  EXPECT_NE(error_of([] { parse_bundle_config("{}", "/b"); }).find("has no root"), std::string::npos);
  EXPECT_NE(error_of([] { parse_bundle_config(R"({"root":{"path":"r"},"process":{"env":[1]}})", "/b"); })
                .find("process.env holds a non-string"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_bundle_config(R"({"root":{"path":"r"},"linux":{"devices":[{"path":"/d","major":"x"}]}})", "/b"); })
                .find("major is \"\\\"x\\\"\""),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_bundle_config(R"({"root":{"path":"r"},"mounts":{}})", "/b"); }).find("mounts is not an array"),
            std::string::npos);
  EXPECT_NE(error_of([] { read_bundle_config("/nonexistent-bundle"); }).find("cannot read /nonexistent-bundle/config.json"),
            std::string::npos);
}

// --- pod identity -----------------------------------------------------------------------------

TEST(PodIdentity, EachRuntimesAnnotations) {
  PodIdentity p = pod_identity({{"io.kubernetes.cri.container-type", "container"},
                                {"io.kubernetes.cri.sandbox-name", "web"},
                                {"io.kubernetes.cri.sandbox-namespace", "prod"},
                                {"io.kubernetes.cri.sandbox-uid", "u-1"},
                                {"io.kubernetes.cri.container-name", "server"}},
                               "cid");
  EXPECT_EQ(p.key(), "prod/web");
  EXPECT_EQ(p.uid, "u-1");
  EXPECT_EQ(p.container_name, "server");
  EXPECT_FALSE(p.sandbox);

  p = pod_identity({{"io.kubernetes.cri-o.ContainerType", "container"},
                    {"io.kubernetes.cri-o.Labels",
                     R"({"io.kubernetes.pod.name":"db","io.kubernetes.pod.namespace":"data","io.kubernetes.pod.uid":"u-2","io.kubernetes.container.name":"pg"})"}},
                   "cid");
  EXPECT_EQ(p.key(), "data/db");
  EXPECT_EQ(p.container_name, "pg");

  p = pod_identity({}, "abc123");
  EXPECT_EQ(p.key(), "uid:abc123") << "outside Kubernetes the container is its own pod";

  EXPECT_TRUE(pod_identity({{"io.kubernetes.cri.container-type", "sandbox"}}, "c").sandbox);
  EXPECT_TRUE(pod_identity({{"io.kubernetes.cri-o.ContainerType", "sandbox"}}, "c").sandbox);
}

// CRI-O copies every pod annotation into the container's spec: a pod that writes
// containerd's keys must neither become the pod they name nor pass as a sandbox.
const char* kCrioLabels =
    R"({"io.kubernetes.pod.name":"attacker","io.kubernetes.pod.namespace":"team-a","io.kubernetes.pod.uid":"u-a","io.kubernetes.container.name":"c"})";

TEST(PodIdentity, ACrioPodNamingAnotherPodWithContainerdKeysStaysItself) {
  PodIdentity p = pod_identity({{"io.kubernetes.cri-o.ContainerType", "container"},
                                {"io.kubernetes.cri-o.Labels", kCrioLabels},
                                {"io.kubernetes.cri.sandbox-name", "victim"},
                                {"io.kubernetes.cri.sandbox-namespace", "team-b"},
                                {"io.kubernetes.cri.sandbox-uid", "u-b"}},
                               "cid");
  EXPECT_EQ(p.key(), "team-a/attacker");
  EXPECT_EQ(p.uid, "u-a");
}

TEST(PodIdentity, ACrioPodClaimingContainerdsSandboxTypeIsRefusedNotSkipped) {
  const std::string err = error_of([] {
    pod_identity({{"io.kubernetes.cri-o.ContainerType", "container"},
                  {"io.kubernetes.cri-o.Labels", kCrioLabels},
                  {"io.kubernetes.cri.container-type", "sandbox"}},
                 "cid");
  });
  EXPECT_NE(err.find("one of them came from the pod"), std::string::npos) << err;
}

TEST(PodIdentity, PlainKubernetesAnnotationsWithoutARuntimeNameNoPod) {
  // Whoever creates a container by hand writes its annotations too: no pod is named by them.
  PodIdentity p = pod_identity({{"io.kubernetes.pod.name", "victim"}, {"io.kubernetes.pod.namespace", "team-b"},
                                {"io.kubernetes.pod.uid", "u-b"}},
                               "cid");
  EXPECT_EQ(p.key(), "uid:cid");
  EXPECT_FALSE(pod_identity({{"io.kubernetes.cri.sandbox-name", "victim"}}, "c").sandbox);
}

TEST(PodIdentity, ARuntimeKeyWithoutItsPodIsRefused) {
  EXPECT_NE(error_of([] { pod_identity({{"io.kubernetes.cri.container-type", "container"}}, "c"); })
                .find("name no pod"),
            std::string::npos);
  EXPECT_NE(error_of([] { pod_identity({{"io.kubernetes.cri-o.ContainerType", "container"}}, "c"); })
                .find("but not io.kubernetes.cri-o.Labels"),
            std::string::npos);
}

TEST(PodIdentity, MalformedAnnotationsAreRefused) {
  EXPECT_NE(error_of([] {
              pod_identity({{"io.kubernetes.cri-o.ContainerType", "container"}, {"io.kubernetes.cri-o.Labels", "{nope"}}, "c");
            }).find("expected a JSON object"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              pod_identity({{"io.kubernetes.cri.container-type", "container"}, {"io.kubernetes.cri.sandbox-name", "a/b"}}, "c");
            }).find("pod name"),
            std::string::npos);
}

// --- annotations ------------------------------------------------------------------------------

TEST(Annotations, EveryPolicyKeyGoesThroughTheConfigParser) {
  common::Policy defaults;
  defaults.weight = 2;
  PodPolicy p = validate_annotations({{"quanta.dev/weight", "7"},
                                      {"quanta.dev/priority", "interactive"},
                                      {"quanta.dev/max-share", "30%"},
                                      {"quanta.dev/memory-limit", "10Gi"},
                                      {"quanta.dev/quantum", "15ms"},
                                      {"other.io/weight", "bogus"}},
                                     defaults);
  EXPECT_EQ(p.resolved.weight, 7u);
  EXPECT_EQ(p.resolved.priority, common::Priority::kInteractive);
  EXPECT_EQ(p.resolved.max_share_ppm, 300000u);
  EXPECT_EQ(p.resolved.memory_limit, 10ull << 30);
  EXPECT_EQ(p.resolved.quantum_ns, 15'000'000u);
  EXPECT_TRUE(p.capped());
  EXPECT_EQ(p.values.size(), 5u) << "other prefixes are not ours";
  EXPECT_EQ(p.values.at("weight"), "7");
  EXPECT_FALSE(validate_annotations({}, defaults).capped());
  EXPECT_EQ(validate_annotations({}, defaults).resolved.weight, 2u) << "unset keys come from [defaults]";
  EXPECT_FALSE(validate_annotations({{"quanta.dev/memory-limit", "none"}}, common::Policy{}).capped());
}

TEST(Annotations, RefusalNamesAnnotationValueAndWhatIsAllowed) {
  std::string e = error_of([] { validate_annotations({{"quanta.dev/weight", "0"}}, common::Policy{}); });
  EXPECT_EQ(e, "annotation quanta.dev/weight = \"0\" is refused: weight \"0\" is not allowed: use a whole number from 1 to 1000");
  e = error_of([] { validate_annotations({{"quanta.dev/wieght", "4"}}, common::Policy{}); });
  EXPECT_NE(e.find("annotation quanta.dev/wieght = \"4\" is refused: unknown policy key \"wieght\": allowed keys are weight"),
            std::string::npos)
      << e;
  e = error_of([] { validate_annotations({{"quanta.dev/quanta.dev/weight", "4"}}, common::Policy{}); });
  EXPECT_NE(e.find("unknown policy key"), std::string::npos) << "a doubled prefix is no key of ours: " << e;
  e = error_of([] { validate_annotations({{"quanta.dev/", "4"}}, common::Policy{}); });
  EXPECT_NE(e.find("unknown policy key"), std::string::npos) << e;
  e = error_of([] { validate_annotations({{"quanta.dev/priority", "urgent\n\x1b[31m"}}, common::Policy{}); });
  EXPECT_EQ(e.find('\n'), std::string::npos) << "a hostile value cannot add lines: " << e;
}

TEST(Annotations, RefusalEscapesBidiOverridesAndC1ControlsOfTheValue) {
  // U+202E (right-to-left override) reorders what an operator reads; U+0085 (NEL) and U+009B
  // (CSI) are line and terminal controls in C1. The arbiter escapes them: so does the hook.
  const std::string e = error_of([] {
    validate_annotations({{"quanta.dev/priority", "batch\xe2\x80\xae" "lacitirc\xc2\x85x\xc2\x9b"}}, common::Policy{});
  });
  EXPECT_EQ(e.find("\xe2\x80\xae"), std::string::npos) << e;
  EXPECT_EQ(e.find("\xc2\x85"), std::string::npos) << e;
  EXPECT_EQ(e.find("\xc2\x9b"), std::string::npos) << e;
  EXPECT_NE(e.find("\\xe2\\x80\\xae"), std::string::npos) << e;
  EXPECT_NE(e.find("\\xc2\\x85"), std::string::npos) << e;
}

// The one table of docs/annotations.md lists exactly the keys the parser takes (as the
// parser itself lists them for an unknown key), each with an example the parser accepts.
TEST(AnnotationDocs, TableListsEveryKeyTheParserTakesWithAcceptedExamples) {
  std::ifstream in(std::string(QUANTA_SOURCE_DIR) + "/docs/annotations.md");
  ASSERT_TRUE(in) << "docs/annotations.md is missing";
  std::stringstream text;
  text << in.rdbuf();
  std::set<std::string> documented;
  const std::regex row(R"(^\| `quanta\.dev/([a-z-]+)` \|.*\| `([^`]+)` \|$)");
  std::string line;
  std::istringstream lines(text.str());
  while (std::getline(lines, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;
    documented.insert(m[1]);
    common::Policy p;
    EXPECT_EQ(error_of([&] { validate_annotations({{"quanta.dev/" + m[1].str(), m[2].str()}}, p); }), "(no error)")
        << "the documented example of " << m[1] << " is refused";
  }
  std::string allowed = error_of([] { validate_annotations({{"quanta.dev/x", "1"}}, common::Policy{}); });
  const size_t at = allowed.find("allowed keys are ");
  ASSERT_NE(at, std::string::npos) << allowed;
  allowed = allowed.substr(at + 17, allowed.find(" (as annotations") - at - 17);
  std::set<std::string> parsed;
  std::istringstream keys(allowed);
  for (std::string k; std::getline(keys, k, ',');) parsed.insert(k.substr(k.find_first_not_of(' ')));
  EXPECT_EQ(documented, parsed) << "docs/annotations.md and the parser disagree (parser: " << allowed << ")";
}

// --- cgroups -----------------------------------------------------------------------------------

TEST(Cgroup, OneRuleForV2V1AndHybridHosts) {
  EXPECT_EQ(common::container_cgroup_path("0::/kubepods.slice/pod1/cri-containerd-a.scope\n"),
            "/kubepods.slice/pod1/cri-containerd-a.scope");
  // v1 only.
  EXPECT_EQ(common::container_cgroup_path("4:memory:/kubepods/burstable/pod1/c\n3:cpu,cpuacct:/kubepods/burstable/pod1/c\n"),
            "/kubepods/burstable/pod1/c");
  // Hybrid, runc: the container joins the unified hierarchy too.
  EXPECT_EQ(common::container_cgroup_path("9:name=systemd:/exp1\n4:memory:/parent/exp1\n0::/exp1\n"), "/exp1");
  // Hybrid, a runtime that left the unified hierarchy at the root: the memory controller.
  EXPECT_EQ(common::container_cgroup_path("9:name=systemd:/exp2\n4:memory:/exp2m\n1:cpu:/exp2\n0::/\n"), "/exp2m");
  EXPECT_EQ(common::container_cgroup_path("9:name=systemd:/x\n1:cpu:/\n0::/\n"), "/x");
  EXPECT_EQ(common::container_cgroup_path("4:memory:/\n0::/\n"), "/");
  EXPECT_EQ(common::container_cgroup_path("junk\n\n::\n"), "");
  EXPECT_EQ(common::container_cgroup_path("0::/a:b\n"), "/a:b") << "a path may hold ':'";
}

TEST(Cgroup, RefusesPathsThatDoNotTellTheContainerApart) {
  EXPECT_EQ(container_cgroup_from("0::/c1\n", "0::/system.slice/containerd.service\n", 7), "/c1");
  EXPECT_NE(error_of([] { container_cgroup_from("4:memory:/\n0::/\n", "0::/x\n", 7); }).find("is the root"),
            std::string::npos);
  EXPECT_NE(error_of([] { container_cgroup_from("0::/shared\n", "0::/shared\n", 7); }).find("the container runtime's own"),
            std::string::npos);
  EXPECT_NE(error_of([] { container_cgroup(0); }).find("createRuntime"), std::string::npos);
}

// --- devices -----------------------------------------------------------------------------------

DeviceTable table() {
  DeviceTable t;
  t.entries = {{"0", "GPU-aaaaaaaa-0000-0000-0000-000000000000", 0, false},
               {"1", "GPU-bbbbbbbb-0000-0000-0000-000000000000", 1, false},
               {"1:0", "MIG-cccccccc-0000-0000-0000-000000000000", 1, true},
               {"1:1", "MIG-dddddddd-0000-0000-0000-000000000000", 1, true}};
  return t;
}

std::vector<std::string> devices_of(const std::string& config, std::vector<std::string>* notes = nullptr,
                                    int* loads = nullptr) {
  BundleConfig c = parse_bundle_config(config, "/b");
  return resolve_devices(gather_device_evidence(c),
                         [loads] {
                           if (loads != nullptr) ++*loads;
                           return table();
                         },
                         notes);
}

TEST(Devices, NvidiaVisibleDevicesByIndexUuidMigAndAll) {
  const std::string a = "GPU-aaaaaaaa-0000-0000-0000-000000000000";
  const std::string c = "MIG-cccccccc-0000-0000-0000-000000000000";
  EXPECT_EQ(devices_of(R"({"root":{"path":"r"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}})"),
            std::vector<std::string>{a});
  EXPECT_EQ(devices_of(R"({"root":{"path":"r"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=1:0, 0"]}})"),
            (std::vector<std::string>{a, c}))
      << "NVML order, whatever order the names came in";
  EXPECT_EQ(devices_of(R"({"root":{"path":"r"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=all"]}})").size(), 4u);
  EXPECT_TRUE(devices_of(R"({"root":{"path":"r"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=void"]}})").empty());
  EXPECT_EQ(devices_of(R"({"root":{"path":"r"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1:1"]}})"),
            std::vector<std::string>{"MIG-dddddddd-0000-0000-0000-000000000000"})
      << "NVIDIA's runtime in CDI mode takes qualified names there";
  EXPECT_NE(error_of([] { devices_of(R"({"root":{"path":"r"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=7"]}})"); })
                .find("names GPU \"7\", which NVML does not list"),
            std::string::npos);
}

TEST(Devices, CdiAnnotationsAndQuantaMarkers) {
  const std::string b = "GPU-bbbbbbbb-0000-0000-0000-000000000000";
  EXPECT_EQ(devices_of(R"({"root":{"path":"r"},"annotations":{"cdi.k8s.io/x":"nvidia.com/gpu=1,vendor.io/nic=0"}})"),
            std::vector<std::string>{b});
  const std::string marker = device_marker_name(b);
  EXPECT_EQ(marker, "QUANTA_DEVICE_GPU_BBBBBBBB_0000_0000_0000_000000000000");
  EXPECT_EQ(devices_of(R"({"root":{"path":"r"},"process":{"env":[")" + marker + "=" + b + R"("]}})"),
            std::vector<std::string>{b});
  // A marker whose name does not match its value is not Quanta's.
  EXPECT_TRUE(devices_of(R"({"root":{"path":"r"},"process":{"env":["QUANTA_DEVICE_X=)" + b + R"("]}})").empty());
  // Quanta's `all` means "whatever else names": alone it is every GPU, beside a name it adds none.
  EXPECT_EQ(devices_of(R"({"root":{"path":"r"},"process":{"env":["QUANTA_DEVICE_ALL=all"]}})").size(), 4u);
  EXPECT_EQ(devices_of(R"({"root":{"path":"r"},"process":{"env":["QUANTA_DEVICE_ALL=all","NVIDIA_VISIBLE_DEVICES=1"]}})"),
            std::vector<std::string>{b});
}

TEST(Devices, DeviceNodesLimitWhatClaimsCanName) {
  const std::string a = "GPU-aaaaaaaa-0000-0000-0000-000000000000";
  std::vector<std::string> notes;
  // The node of GPU 0 only: a claim of GPU 1 is dropped with a note.
  EXPECT_EQ(devices_of(R"({"root":{"path":"r"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=0,1"]},
                          "linux":{"devices":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0},
                                              {"path":"/dev/nvidiactl","type":"c","major":195,"minor":255}]}})",
                       &notes),
            std::vector<std::string>{a});
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("no device node"), std::string::npos);
  // Nodes and no claim: every GPU (and MIG instance) behind the nodes.
  EXPECT_EQ(devices_of(R"({"root":{"path":"r"},"linux":{"devices":[{"path":"/dev/nvidia1","type":"c","major":195,"minor":1}]}})")
                .size(),
            3u);
  // A cgroup rule granting every NVIDIA node (privileged-style): all of them.
  EXPECT_EQ(devices_of(R"({"root":{"path":"r"},"linux":{"resources":{"devices":[{"allow":true,"type":"c","major":195,"access":"rw"}]}}})")
                .size(),
            4u);
  // mknod-only rules ("c *:* m") grant no use.
  EXPECT_TRUE(devices_of(R"({"root":{"path":"r"},"linux":{"resources":{"devices":[{"allow":true,"type":"c","access":"m"}]}}})").empty());
}

TEST(Devices, FullUuidsNeedNoNvml) {
  int loads = 0;
  EXPECT_EQ(devices_of(R"({"root":{"path":"r"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=gpu-AAAAAAAA-0000-0000-0000-000000000000"]}})",
                       nullptr, &loads),
            std::vector<std::string>{"GPU-aaaaaaaa-0000-0000-0000-000000000000"});
  EXPECT_EQ(loads, 0);
  EXPECT_TRUE(devices_of(R"({"root":{"path":"r"}})", nullptr, &loads).empty());
  EXPECT_EQ(loads, 0) << "a container with no GPU evidence costs no NVML call";
}

// --- CDI specs -----------------------------------------------------------------------------------

CdiOptions options() {
  CdiOptions o;
  o.layout.prefix = "/opt/quanta";
  o.layout.host_socket = "/run/quanta/tenant.sock";
  o.hook_timeout_ns = 5'000'000'000;
  return o;
}

TEST(CdiSpec, QuantaGpuSpecNamesEveryDeviceAndCarriesMountsAndHooks) {
  json spec = quanta_gpu_spec(options(), table());
  EXPECT_EQ(spec["kind"], "quanta.dev/gpu");
  EXPECT_EQ(spec["cdiVersion"], "0.5.0") << "names starting with a digit need 0.5.0, nothing needs more";
  std::set<std::string> names;
  for (const json& d : spec["devices"]) {
    names.insert(d["name"]);
    EXPECT_FALSE(d["containerEdits"]["env"].empty()) << "CDI refuses devices with empty edits";
  }
  EXPECT_EQ(names, (std::set<std::string>{"0", "1", "1:0", "1:1", "GPU-aaaaaaaa-0000-0000-0000-000000000000",
                                          "GPU-bbbbbbbb-0000-0000-0000-000000000000",
                                          "MIG-cccccccc-0000-0000-0000-000000000000",
                                          "MIG-dddddddd-0000-0000-0000-000000000000", "all"}));
  std::map<std::string, std::string> mounts;
  for (const json& m : spec["containerEdits"]["mounts"]) {
    mounts[m["containerPath"]] = m["hostPath"];
    EXPECT_EQ(m["options"][0], "ro");
    EXPECT_FALSE(m.contains("type")) << "mount type would need cdiVersion 0.4.0";
  }
  EXPECT_EQ(mounts["/opt/quanta/lib/libquanta.so"], "/opt/quanta/lib/libquanta.so");
  EXPECT_EQ(mounts["/etc/ld.so.preload"], "/opt/quanta/etc/ld.so.preload");
  EXPECT_EQ(mounts["/etc/quanta"], "/opt/quanta/etc");
  EXPECT_EQ(mounts["/run/quanta"], "/run/quanta");
  std::vector<std::string> stages;
  for (const json& h : spec["containerEdits"]["hooks"]) {
    stages.push_back(h["hookName"]);
    EXPECT_EQ(h["path"], "/opt/quanta/bin/quanta-hook");
    EXPECT_EQ(h["env"], json::array({"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}))
        << "a hook without env runs in the container's environment under runc";
    EXPECT_EQ(h["timeout"], 15);
  }
  EXPECT_EQ(stages, (std::vector<std::string>{"createRuntime", "createContainer", "poststop"}));
}

TEST(CdiSpec, TakeOverKeepsTheVendorsEditsAndFieldsAndAddsQuantas) {
  const json vendor = json::parse(R"({
    "cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
    "annotations": {"vendor": "yes"},
    "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
                       "mounts": [{"hostPath": "/usr/lib/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1", "options": ["ro"]}],
                       "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "update-ldcache"]}]},
    "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
                {"name": "GPU-zzz", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia9"}]}},
                {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}]
  })");
  json spec = take_over_spec(options(), vendor, table());
  EXPECT_EQ(spec["kind"], "nvidia.com/gpu");
  EXPECT_EQ(spec["cdiVersion"], "0.6.0") << "never below the vendor's own version";
  EXPECT_EQ(spec["annotations"]["vendor"], "yes");
  const json& edits = spec["containerEdits"];
  EXPECT_EQ(edits["env"][0], "NVIDIA_VISIBLE_DEVICES=void");
  EXPECT_EQ(edits["mounts"][0]["hostPath"], "/usr/lib/libcuda.so.1") << "the vendor's mounts first";
  EXPECT_EQ(edits["mounts"].size(), 5u);
  EXPECT_EQ(edits["hooks"][0]["path"], "/usr/bin/nvidia-cdi-hook");
  EXPECT_EQ(edits["hooks"].size(), 4u);
  ASSERT_EQ(spec["devices"].size(), 3u);
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"], "/dev/nvidia0");
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["env"][0],
            device_marker_name("GPU-aaaaaaaa-0000-0000-0000-000000000000") + "=GPU-aaaaaaaa-0000-0000-0000-000000000000");
  EXPECT_FALSE(spec["devices"][1]["containerEdits"].contains("env")) << "a name NVML does not know gets no marker";
  EXPECT_EQ(spec["devices"][2]["containerEdits"]["env"][0], "QUANTA_DEVICE_ALL=all");

  EXPECT_NE(error_of([] { take_over_spec(options(), json::object(), table()); }).find("not a CDI spec"), std::string::npos);
  EXPECT_NE(error_of([&] { take_over_spec(options(), quanta_gpu_spec(options(), table()), table()); }).find("Quanta's own"),
            std::string::npos);
}

// A vendor spec whose edits are not the shapes CDI defines is refused with a HookError that
// names the field, never taken over with its edits dropped or left to throw something else.
TEST(CdiSpec, TakeOverRefusesEditsOfTheWrongShapeByName) {
  auto take_over = [](const char* text) {
    return error_of([&] { take_over_spec(options(), json::parse(text), table()); });
  };
  EXPECT_EQ(take_over(R"({"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0"}],
                          "containerEdits":{"mounts":"x"}})"),
            "the spec to take over has containerEdits.mounts of type string: a list is allowed");
  EXPECT_EQ(take_over(R"({"cdiVersion":"0.5.0","kind":"nvidia.com/gpu",
                          "devices":[{"name":"0","containerEdits":{"env":7}}]})"),
            "the spec to take over has containerEdits.env of type number in device \"0\": a list is allowed");
  EXPECT_EQ(take_over(R"({"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[],"containerEdits":[1]})"),
            "the spec to take over has containerEdits of type array: an object is allowed");
  EXPECT_EQ(take_over(R"({"cdiVersion":"0.5.0","kind":"nvidia.com/gpu",
                          "devices":[{"name":"all","containerEdits":"x"}]})"),
            "the spec to take over has containerEdits of type string in device \"all\": an object is allowed");
  // null reads as absent, as CDI's loader reads it.
  const json spec = take_over_spec(
      options(),
      json::parse(R"({"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","containerEdits":{"hooks":null},
                     "devices":[{"name":"0","containerEdits":null}]})"),
      table());
  EXPECT_EQ(spec["containerEdits"]["hooks"].size(), 3u);
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["env"].size(), 1u);
}

TEST(CdiSpec, MinimumVersionFollowsTheFieldsUsed) {
  EXPECT_EQ(minimum_cdi_version(json::parse(R"({"kind":"a.b/c","devices":[{"name":"x"}]})")), "0.3.0");
  EXPECT_EQ(minimum_cdi_version(json::parse(R"({"kind":"a.b/c","devices":[{"name":"x"}],"containerEdits":{"mounts":[{"type":"bind"}]}})")),
            "0.4.0");
  EXPECT_EQ(minimum_cdi_version(json::parse(R"({"kind":"a.b/c","devices":[{"name":"0"}]})")), "0.5.0");
  EXPECT_EQ(minimum_cdi_version(json::parse(R"({"kind":"a.b/c","devices":[{"name":"x","containerEdits":{"deviceNodes":[{"hostPath":"/d"}]}}]})")),
            "0.5.0");
  EXPECT_EQ(minimum_cdi_version(json::parse(R"({"kind":"a.b/c.d","devices":[{"name":"x"}]})")), "0.6.0");
  EXPECT_EQ(minimum_cdi_version(json::parse(R"({"kind":"a.b/c","annotations":{},"devices":[]})")), "0.6.0");
  EXPECT_EQ(minimum_cdi_version(json::parse(R"({"kind":"a.b/c","containerEdits":{"additionalGids":[5]}})")), "0.7.0");
}

TEST(CdiSpec, TakeOverMustOutrankTheVendorsFolder) {
  EXPECT_NE(error_of([] { check_take_over_priority("/etc/cdi/nvidia.yaml", "/etc/cdi/quanta.yaml", "/etc/cdi,/var/run/cdi"); })
                .find("same CDI folder"),
            std::string::npos);
  EXPECT_NE(error_of([] { check_take_over_priority("/var/run/cdi/nvidia.json", "/etc/cdi/q.yaml", "/etc/cdi,/var/run/cdi"); })
                .find("lower priority"),
            std::string::npos);
  EXPECT_NE(error_of([] { check_take_over_priority("/etc/cdi/nvidia.yaml", "/tmp/q.yaml", "/etc/cdi,/var/run/cdi"); })
                .find("not in one of the CDI folders"),
            std::string::npos);
  EXPECT_EQ(error_of([] { check_take_over_priority("/etc/cdi/nvidia.yaml", "/var/run/cdi/q.yaml", "/etc/cdi,/var/run/cdi"); }),
            "(no error)");
}

// --- YAML -------------------------------------------------------------------------------------------

TEST(SpecIo, YamlRoundTripKeepsTypes) {
  const json spec = quanta_gpu_spec(options(), table());
  const std::string yaml = to_text(spec, SpecFormat::kYaml);
  EXPECT_NE(yaml.find("name: \"0\""), std::string::npos) << "device names stay strings";
  EXPECT_NE(yaml.find("timeout: 15"), std::string::npos) << "numbers stay numbers";
  EXPECT_EQ(parse_spec_text(yaml, SpecFormat::kYaml, "t"), spec);
  // nvidia-ctk's style: plain scalars, numbers for major/minor.
  const json v = parse_spec_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: gpu0\n  containerEdits:\n"
                                 "    deviceNodes:\n    - path: /dev/nvidia0\n      major: 195\n      minor: 0\n",
                                 SpecFormat::kYaml, "t");
  EXPECT_EQ(v["cdiVersion"], "0.5.0");
  EXPECT_EQ(v["devices"][0]["containerEdits"]["deviceNodes"][0]["major"], 195);
  EXPECT_NE(error_of([] { parse_spec_text("a: [1, 2", SpecFormat::kYaml, "bad.yaml"); }).find("bad.yaml is not valid YAML"),
            std::string::npos);
  EXPECT_NE(error_of([] { format_of_path("/etc/cdi/x.txt"); }).find(".yaml or .json"), std::string::npos);
  EXPECT_NE(error_of([] { parse_format("toml"); }).find("use yaml or json"), std::string::npos);
}

// --- settings files -----------------------------------------------------------------------------------

TEST(Layout, SettingsFilesSayWhatTheShimReads) {
  config::NodeConfig config;
  config.enforce.enforce = false;
  config.enforce.unplaced = config::UnplacedAction::kClosedIfCapped;
  Layout layout;
  layout.host_socket = "/var/quanta/sock/tenant.sock";
  const std::string node = node_conf_text(config, layout);
  EXPECT_NE(node.find("\nenforce = off\n"), std::string::npos) << node;
  EXPECT_NE(node.find("\nunplaced = closed-if-capped\n"), std::string::npos) << node;
  EXPECT_NE(node.find("\nsocket = /run/quanta/tenant.sock\n"), std::string::npos) << "the in-container path: " << node;
  const std::string c = container_conf_text("cid", "prod/web", true, true);
  EXPECT_NE(c.find("\npod = prod/web\nmemory_limit = 1\nunplaced = closed\n"), std::string::npos) << c;
  EXPECT_EQ(preload_text(), "/opt/quanta/lib/libquanta.so\n");
  EXPECT_TRUE(unplaced_closed(config, true));
  EXPECT_FALSE(unplaced_closed(config, false));
  config.enforce.unplaced = config::UnplacedAction::kClosed;
  EXPECT_TRUE(unplaced_closed(config, false));
  config.enforce.unplaced = config::UnplacedAction::kOpen;
  EXPECT_FALSE(unplaced_closed(config, true));
}

}  // namespace
}  // namespace quanta::hooks
