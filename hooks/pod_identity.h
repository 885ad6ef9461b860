// Which pod a container belongs to, from the annotations its runtime wrote into config.json:
// containerd's io.kubernetes.cri.*, CRI-O's io.kubernetes.cri-o.Labels, Kubernetes'
// io.kubernetes.pod.* and, outside Kubernetes, the container id itself.
#pragma once

#include <map>
#include <string>

namespace quanta::hooks {

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

// Throws HookError when the runtime's annotations are malformed (CRI-O's Labels not JSON).
PodIdentity pod_identity(const std::map<std::string, std::string>& annotations,
                         const std::string& container_id);

}  // namespace quanta::hooks
