// The stages in order of what each needs: identity and policy first (a refused annotation
// must fail before anything is registered), then cgroup and devices, then the arbiter.
#include "hooks/stages.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "hosted/admin_client.h"
#include "hooks/annotations.h"
#include "hooks/bundle.h"
#include "hooks/cgroup.h"
#include "hooks/container_mounts.h"
#include "hooks/devices.h"
#include "hooks/error.h"
#include "hooks/pod_identity.h"

namespace quanta::hooks {
namespace {

std::string bundle_conf_path(const OciState& state) {
  return state.bundle + "/" + kBundleContainerConf;
}

std::string seconds(uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3gs", static_cast<double>(ns) / 1e9);
  return buf;
}

}  // namespace

void create_runtime(StageContext& ctx) {
  const OciState& s = ctx.state;
  const BundleConfig bundle = read_bundle_config(s.bundle);
  const PodIdentity pod = pod_identity(bundle.annotations, s.id);
  if (pod.sandbox) return;
  const PodPolicy policy = validate_annotations(bundle.annotations, ctx.config.defaults);
  const std::string cgroup = ctx.cgroup(s.pid);
  const std::function<DeviceTable()> table =
      ctx.devices ? ctx.devices : [&ctx] {
        return arbiter_device_table(ctx.config.admin_socket, ctx.config.hook.timeout_ns);
      };
  hosted::AdminReply reply;
  try {
    std::vector<std::string> notes;
    const std::vector<std::string> devices =
        resolve_devices(gather_device_evidence(bundle), table, &notes);
    for (const std::string& n : notes) ctx.notes.push_back("container " + s.id + ": " + n);
    nlohmann::json request{{"cmd", "register"},
                           {"container_id", s.id},
                           {"pod_uid", pod.uid},
                           {"pod_name", pod.name},
                           {"pod_namespace", pod.ns},
                           {"container_name", pod.container_name},
                           {"cgroup_path", cgroup},
                           {"devices", devices},
                           {"policy", policy.values}};
    reply = hosted::admin_request(ctx.config.admin_socket, request, ctx.config.hook.timeout_ns);
  } catch (const ArbiterUnreachable& e) {
    reply.outcome = hosted::AdminOutcome::kUnreachable;
    reply.reason = e.what();
  }
  std::string pod_key = pod.key();
  const bool closed = unplaced_closed(ctx.config, policy.capped());
  switch (reply.outcome) {
    case hosted::AdminOutcome::kAnswered: {
      auto answered = reply.response.find("pod");
      if (answered != reply.response.end() && answered->is_string())
        pod_key = answered->get<std::string>();
      break;
    }
    case hosted::AdminOutcome::kRefused:
      throw HookError("the arbiter refused container " + s.id + " of pod " + pod_key + ": " +
                      reply.reason);
    case hosted::AdminOutcome::kUnreachable: {
      const std::string rule =
          std::string("[enforce] unplaced = ") + config::unplaced_name(ctx.config.enforce.unplaced);
      if (closed)
        throw HookError("refusing container " + s.id + " of pod " + pod_key + ": " +
                        reply.reason + ", and " + rule +
                        (policy.capped() ? " (the pod asked for a memory limit)" : "") +
                        " keeps pods off the GPU while Quanta cannot place them");
      ctx.notes.push_back("container " + s.id + " of pod " + pod_key +
                          " starts ungated and uncapped: " + reply.reason + " (" + rule +
                          ", gave up after at most " + seconds(ctx.config.hook.timeout_ns) + ")");
      break;
    }
  }
  write_file_atomically(bundle_conf_path(s),
                        container_conf_text(s.id, pod_key, policy.capped(), closed), 0444);
}

void create_container(StageContext& ctx) {
  const OciState& s = ctx.state;
  const BundleConfig bundle = read_bundle_config(s.bundle);
  if (pod_identity(bundle.annotations, s.id).sandbox) return;
  const std::string conf = bundle_conf_path(s);
  if (access(conf.c_str(), R_OK) != 0)
    throw HookError("container " + s.id + " has no " + conf +
                    ": the createRuntime stage (quanta-hook oci create-runtime) did not run "
                    "for it; check that the CDI spec or hooks.d files are Quanta's current ones");
  for (const QuantaMount& m : quanta_mounts(ctx.layout)) {
    const auto& done = bundle.mount_destinations;
    if (std::find(done.begin(), done.end(), m.container) != done.end()) continue;
    bind_read_only(bundle.root_path, m.host, m.container, m.directory);
  }
  bind_read_only(bundle.root_path, conf, kContainerConf, false);
}

void poststop(StageContext& ctx) {
  const OciState& s = ctx.state;
  // A bundle that is already gone still names a container the arbiter may know.
  try {
    if (pod_identity(read_bundle_config(s.bundle).annotations, s.id).sandbox) return;
  } catch (const HookError& e) {
    ctx.notes.push_back("container " + s.id + ": " + e.what() + "; unregistering it anyway");
  }
  const hosted::AdminReply reply = hosted::admin_request(ctx.config.admin_socket,
                                         {{"cmd", "unregister"}, {"container_id", s.id}},
                                         ctx.config.hook.timeout_ns);
  if (reply.outcome == hosted::AdminOutcome::kUnreachable)
    ctx.notes.push_back("container " + s.id + " could not be unregistered: " + reply.reason +
                        "; the registration stays in the arbiter's state, matching no process once the container's cgroup is gone");
  ::unlink(bundle_conf_path(s).c_str());
}

}  // namespace quanta::hooks
