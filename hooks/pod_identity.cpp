// The pod a container belongs to, read only from the keys its runtime writes itself: the
// runtime is told first (containerd's or CRI-O's container-type key), then that runtime's
// keys alone are read. docs/containers.md ("Which annotations name the pod") has the table.
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

Runtime runtime_of(const std::map<std::string, std::string>& a) {
  const bool containerd = a.count(kContainerdType) != 0;
  const bool crio = a.count(kCrioType) != 0;
  if (containerd && crio)
    throw HookError(std::string("the container carries both containerd's ") + kContainerdType +
                    " and CRI-O's " + kCrioType +
                    ": a runtime writes only its own, so one of them came from the pod; refusing "
                    "a container whose runtime cannot be told");
  if (containerd) return Runtime::kContainerd;
  if (crio) return Runtime::kCrio;
  return Runtime::kNone;
}

PodIdentity pod_identity(const std::map<std::string, std::string>& a,
                         const std::string& container_id) {
  PodIdentity p;
  switch (runtime_of(a)) {
    case Runtime::kContainerd:
      // containerd writes these for every CRI container, after (and over) any pod
      // annotation its pod_annotations globs let through.
      p.source = "containerd's io.kubernetes.cri.* annotations";
      p.sandbox = get(a, kContainerdType) == "sandbox";
      p.name = get(a, "io.kubernetes.cri.sandbox-name");
      p.ns = get(a, "io.kubernetes.cri.sandbox-namespace");
      p.uid = get(a, "io.kubernetes.cri.sandbox-uid");
      p.container_name = get(a, "io.kubernetes.cri.container-name");
      break;
    case Runtime::kCrio: {
      // CRI-O copies every pod annotation into the spec, then writes its own keys over
      // them: only io.kubernetes.cri-o.* is CRI-O's word (the kubelet's labels in Labels).
      p.source = "CRI-O's io.kubernetes.cri-o.* annotations";
      p.sandbox = get(a, kCrioType) == "sandbox";
      auto labels = a.find("io.kubernetes.cri-o.Labels");
      if (labels == a.end()) {
        if (p.sandbox) break;
        throw HookError(std::string("the container carries CRI-O's ") + kCrioType +
                        " but not io.kubernetes.cri-o.Labels, which CRI-O writes for every "
                        "container: its pod cannot be told");
      }
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
      break;
    }
    case Runtime::kNone:
      // Not created by a Kubernetes runtime (podman, runc by hand): whoever wrote the
      // annotations also chose them, so none of them names a pod.
      break;
  }
  if (p.sandbox) return p;
  if (p.name.empty() && p.uid.empty()) {
    if (!p.source.empty())
      throw HookError(p.source + " name no pod (no pod name and no pod uid)");
    p.source = "the container id (no Kubernetes runtime annotations)";
    p.uid = container_id;
  }
  if (p.container_name.empty()) p.container_name = container_id;
  check_name(p.name, "pod name", p.source);
  check_name(p.ns, "pod namespace", p.source);
  check_name(p.uid, "pod uid", p.source);
  check_name(p.container_name, "container name", p.source);
  return p;
}

}  // namespace quanta::hooks
