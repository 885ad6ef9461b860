// Which pod a container belongs to, from the annotations its runtime wrote into config.json:
// containerd's io.kubernetes.cri.* or CRI-O's io.kubernetes.cri-o.*, whichever runtime
// created it, and outside Kubernetes the container id itself. A pod chooses annotations of
// its own (CRI-O copies them all into the spec), so the runtime is told first and only its
// own keys count.
#pragma once

#include <map>
#include <string>

namespace quanta::hooks {

// The key each runtime writes for every container it creates ("container" or "sandbox").
inline constexpr const char* kContainerdType = "io.kubernetes.cri.container-type";
inline constexpr const char* kCrioType = "io.kubernetes.cri-o.ContainerType";

enum class Runtime { kContainerd, kCrio, kNone };
// Throws HookError when both runtimes' keys are present: one of them is the pod's forgery.
Runtime runtime_of(const std::map<std::string, std::string>& annotations);

struct PodIdentity {
  std::string uid;
  std::string name;
  std::string ns;  // namespace
  std::string container_name;
  bool sandbox = false;  // the pod's sandbox (pause/infra) container: nothing to do
  std::string source;    // which annotations said so, for messages

  // The arbiter's pod key: "namespace/name", or "uid:<uid>" without a name.
  std::string key() const;
};

// Throws HookError when the runtime's annotations are malformed (CRI-O's Labels not JSON),
// incomplete or ambiguous.
PodIdentity pod_identity(const std::map<std::string, std::string>& annotations,
                         const std::string& container_id);

}  // namespace quanta::hooks
