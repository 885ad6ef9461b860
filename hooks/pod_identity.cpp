// The runtimes' annotation names, in the order they are trusted: containerd's own keys,
// then CRI-O's labels (the kubelet's io.kubernetes.* labels as a JSON object), then those
// labels as plain annotations, then the container alone.
#include "hooks/pod_identity.h"

#include <nlohmann/json.hpp>

#include "hooks/error.h"

namespace quanta::hooks {
namespace {

std::string get(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? "" : it->second;
}

// Kubernetes names (DNS labels, subdomains, UIDs) are short and printable; anything else
// in an annotation is not a pod name the arbiter should key a pod by.
void check_name(const std::string& text, const char* what, const std::string& source) {
  bool ok = text.size() <= 253;
  for (unsigned char c : text) ok = ok && c > 0x20 && c < 0x7f && c != '/';
  if (!ok)
    throw HookError(source + " gives the " + what + " " + shown(text) +
                    ": expected a Kubernetes name (up to 253 printable characters, no '/')");
}

}  // namespace

std::string PodIdentity::key() const {
  if (!name.empty()) return (ns.empty() ? "default" : ns) + "/" + name;
  return "uid:" + uid;
}

PodIdentity pod_identity(const std::map<std::string, std::string>& a,
                         const std::string& container_id) {
  PodIdentity p;
  if (get(a, "io.kubernetes.cri.container-type") == "sandbox" ||
      get(a, "io.kubernetes.cri-o.ContainerType") == "sandbox") {
    p.sandbox = true;
  }

  if (!get(a, "io.kubernetes.cri.sandbox-name").empty()) {
    p.source = "containerd's io.kubernetes.cri.* annotations";
    p.name = get(a, "io.kubernetes.cri.sandbox-name");
    p.ns = get(a, "io.kubernetes.cri.sandbox-namespace");
    p.uid = get(a, "io.kubernetes.cri.sandbox-uid");
    p.container_name = get(a, "io.kubernetes.cri.container-name");
  } else if (auto labels = a.find("io.kubernetes.cri-o.Labels"); labels != a.end()) {
    p.source = "CRI-O's io.kubernetes.cri-o.Labels annotation";
    nlohmann::json j = nlohmann::json::parse(labels->second, nullptr, false);
    if (!j.is_object())
      throw HookError("annotation io.kubernetes.cri-o.Labels is " + shown(labels->second) +
                      ": expected a JSON object of labels");
    auto label = [&j](const char* key) {
      auto it = j.find(key);
      return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    p.name = label("io.kubernetes.pod.name");
    p.ns = label("io.kubernetes.pod.namespace");
    p.uid = label("io.kubernetes.pod.uid");
    p.container_name = label("io.kubernetes.container.name");
  } else if (!get(a, "io.kubernetes.pod.name").empty()) {
    p.source = "the io.kubernetes.pod.* annotations";
    p.name = get(a, "io.kubernetes.pod.name");
    p.ns = get(a, "io.kubernetes.pod.namespace");
    p.uid = get(a, "io.kubernetes.pod.uid");
    p.container_name = get(a, "io.kubernetes.container.name");
  }

  if (p.name.empty() && p.uid.empty()) {
    // Not a Kubernetes pod (podman, runc by hand): the container is its own pod.
    p.source = "the container id (no pod annotations)";
    p.uid = container_id;
    p.name.clear();
    p.ns.clear();
  }
  if (p.container_name.empty()) p.container_name = container_id;
  check_name(p.name, "pod name", p.source);
  check_name(p.ns, "pod namespace", p.source);
  check_name(p.uid, "pod uid", p.source);
  check_name(p.container_name, "container name", p.source);
  return p;
}

}  // namespace quanta::hooks
