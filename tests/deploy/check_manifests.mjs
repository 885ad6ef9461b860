// Every Kubernetes object under deploy/ validated against its API schema (kubernetes-models
// for the core API, @kubernetes-models/prometheus-operator for PodMonitor/PrometheusRule)
// and for unknown fields (strict_fields.mjs), plus what the schemas cannot say about the node agent: probes on the metrics port the
// node config serves, the arbiter kept in the foreground, resources on every container,
// and a comment justifying each host namespace, privilege and host path.
import fs from "node:fs";
import path from "node:path";
import YAML from "yaml";
import { declarationFor, unknownFields } from "./strict_fields.mjs";
import { Report, assemble, loadYamlDocs, manifestFiles, modelFor, podSpec, podContainers, rel, root } from "./lib.mjs";

const report = new Report("deploy manifests");

// 1. Schemas: every file's objects and the objects kustomize generates.
const objects = [];
for (const file of manifestFiles()) {
  let docs;
  try {
    docs = loadYamlDocs(file);
  } catch (e) {
    report.fail(e.message);
    continue;
  }
  for (const d of docs) objects.push(d);
}
const base = assemble(path.join(root, "deploy"));
for (const o of base.objects) if (o.index === -1) objects.push(o);

for (const { file, index, object } of objects) {
  const where = `${rel(file)}${index >= 0 ? "#" + (index + 1) : " (generated)"} ${object?.kind}/${object?.metadata?.name}`;
  if (!object?.apiVersion || !object?.kind) {
    report.fail(`${where}: not a Kubernetes object (no apiVersion/kind)`);
    continue;
  }
  const Model = await modelFor(object.apiVersion, object.kind);
  if (!Model) {
    report.fail(`${where}: no schema for ${object.apiVersion} ${object.kind}`);
    continue;
  }
  try {
    new Model(object).validate();
    report.ok(`${where} matches the ${object.apiVersion} ${object.kind} schema`);
  } catch (e) {
    report.fail(`${where}: ${e.message}`);
  }
  // kubectl apply refuses unknown fields (strict field validation); the schemas do not.
  const dts = declarationFor(object.apiVersion, object.kind);
  if (report.check(!!dts, `${where}: the ${object.kind} model declares its fields`)) {
    for (const u of unknownFields(object, dts)) report.fail(`${where}: ${u}`);
  }
  if (!object.metadata?.name) report.fail(`${where}: metadata.name is missing`);
}

// 2. The node agent.
const ds = base.objects.find((o) => o.object.kind === "DaemonSet" && o.object.metadata.name === "quanta-arbiter");
const cm = base.objects.find((o) => o.object.kind === "ConfigMap" && o.object.metadata.name === "quanta-node-config");
if (!report.check(ds && cm, "the base holds the quanta-arbiter DaemonSet and the quanta-node-config ConfigMap")) report.finish();
const spec = podSpec(ds.object);
const arbiter = spec.containers.find((c) => c.name === "arbiter");
const args = [...(arbiter.command ?? []), ...(arbiter.args ?? [])];
report.check(args.some((a) => a.endsWith("quanta-arbiter")), "the arbiter container runs quanta-arbiter");
report.check(args.includes("--foreground"), "the arbiter runs with --foreground (a detached arbiter reads as an exit to the runtime)");
report.check(args.includes("--wait-for-gpus"), "the arbiter waits for GPUs instead of exiting into a crash loop");
const listen = (cm.object.data["quanta.toml"].match(/^\s*listen\s*=\s*"([^"]*)"/m) ?? [])[1] ?? "";
const port = Number(listen.split(":").pop());
const metricsPort = (arbiter.ports ?? []).find((p) => p.name === "metrics");
report.check(metricsPort && metricsPort.containerPort === port,
  `the container's metrics port (${metricsPort?.containerPort}) is the [metrics] listen port of the node config (${listen})`);
// Liveness and start-up ask /healthz (503 once the event loop stops publishing); readiness
// asks /metrics, what Prometheus scrapes.
for (const [probe, path] of [["startupProbe", "/healthz"], ["readinessProbe", "/metrics"], ["livenessProbe", "/healthz"]]) {
  const p = arbiter[probe];
  report.check(p?.httpGet?.path === path && (p.httpGet.port === "metrics" || p.httpGet.port === port),
    `${probe} requests ${path} on the metrics port`);
}
const configArg = args.find((a) => a.startsWith("--config="))?.slice("--config=".length);
const configMount = (arbiter.volumeMounts ?? []).find((m) => configArg?.startsWith(m.mountPath + "/"));
const configVolume = spec.volumes.find((v) => v.name === configMount?.name);
report.check(configVolume?.configMap?.name === "quanta-node-config" &&
  cm.object.data[path.basename(configArg ?? "")] !== undefined,
  `--config=${configArg} is the quanta.toml key of the quanta-node-config ConfigMap`);
report.check(!!spec.priorityClassName, `priorityClassName is set (${spec.priorityClassName})`);
report.check(ds.object.spec.updateStrategy?.type === "RollingUpdate", "updateStrategy is RollingUpdate");
report.check((ds.object.spec.updateStrategy?.rollingUpdate?.maxSurge ?? 0) === 0,
  "maxSurge is 0 (two arbiters on one node refuse each other)");
for (const c of podContainers(ds.object)) {
  const r = c.resources ?? {};
  report.check(r.requests?.cpu && r.requests?.memory && r.limits?.cpu && r.limits?.memory,
    `container ${c.name} has cpu and memory requests and limits`);
  for (const m of c.volumeMounts ?? []) {
    report.check(spec.volumes.some((v) => v.name === m.name), `container ${c.name} mounts volume ${m.name}, which exists`);
  }
}
const affinityKeys = JSON.stringify(spec.affinity?.nodeAffinity ?? {});
report.check(affinityKeys.includes("nvidia.com/gpu.present"), "node affinity selects nodes labelled nvidia.com/gpu.present");
report.check(!podContainers(ds.object).some((c) => JSON.stringify(c.resources ?? {}).includes("nvidia.com/gpu")),
  "no container takes a GPU from the device plugin (the arbiter must not consume a replica)");

// 3. Each host namespace, privilege and host path carries a comment saying why: the
// comment must sit directly above the line, or above a run of sibling mount lines.
const lines = fs.readFileSync(ds.file, "utf8").split("\n");
const commented = (i) => {
  for (let j = i - 1; j >= 0; j--) {
    const t = lines[j].trim();
    if (t.startsWith("#")) return true;
    if (!t.startsWith("- {name:")) return false;
  }
  return false;
};
const hostVolumes = new Set(spec.volumes.filter((v) => v.hostPath).map((v) => v.name));
lines.forEach((line, i) => {
  const t = line.trim();
  if (/^(hostPID|hostIPC|hostNetwork|privileged):\s*true/.test(t) || /^add:/.test(t)) {
    report.check(commented(i), `${rel(ds.file)}:${i + 1} "${t}" has a comment saying why`);
  }
  const m = t.match(/^- \{name: ([\w-]+), mountPath:/);
  if (m && hostVolumes.has(m[1])) {
    report.check(commented(i), `${rel(ds.file)}:${i + 1} host path ${m[1]} mount has a comment saying why`);
  }
});

// 4. Names, namespaces and labels: every object of the base lives in the Namespace the base
// creates, and the workload's selector matches its pod labels.
const ns = base.objects.filter((o) => o.object.kind === "Namespace").map((o) => o.object.metadata.name);
for (const { file, object } of base.objects) {
  if (object.kind === "Namespace") continue;
  report.check(ns.includes(object.metadata.namespace),
    `${rel(file)} ${object.kind}/${object.metadata.name} is in the base's namespace (${object.metadata.namespace})`);
  report.check(object.metadata.labels?.["app.kubernetes.io/part-of"] === "quanta",
    `${object.kind}/${object.metadata.name} is labelled app.kubernetes.io/part-of=quanta`);
}
const sel = ds.object.spec.selector.matchLabels;
report.check(Object.entries(sel).every(([k, v]) => ds.object.spec.template.metadata.labels[k] === v),
  "the DaemonSet's selector matches its pod template labels");
for (const kind of ["PodMonitor"]) {
  const pm = base.objects.find((o) => o.object.kind === kind)?.object;
  report.check(pm && Object.entries(pm.spec.selector.matchLabels).every(([k, v]) => ds.object.spec.template.metadata.labels[k] === v),
    `the ${kind} selects the arbiter pods`);
  report.check(pm && pm.spec.podMetricsEndpoints.every((e) => e.port === metricsPort?.name), `the ${kind} scrapes the port named ${metricsPort?.name}`);
  report.check(pm && pm.spec.namespaceSelector?.matchNames?.includes(ds.object.metadata.namespace), `the ${kind} looks in the DaemonSet's namespace`);
}

// 5. The device plugin's time-slicing config: replicas and failRequestsGreaterThanOne.
// Only Prometheus reaches the metrics port: a NetworkPolicy that selects the arbiter pods,
// restricts ingress, and admits that port from Prometheus' pods alone.
{
  const np = base.objects.find((o) => o.object.kind === "NetworkPolicy")?.object;
  report.check(np && Object.entries(np.spec.podSelector.matchLabels ?? {}).every(([k, v]) => ds.object.spec.template.metadata.labels[k] === v),
    "a NetworkPolicy selects the arbiter pods");
  report.check(np && np.spec.policyTypes?.includes("Ingress"), "the NetworkPolicy restricts ingress");
  const rules = np?.spec.ingress ?? [];
  report.check(rules.length > 0 && rules.every((r) => (r.ports ?? []).length > 0 &&
    r.ports.every((p) => p.port === metricsPort?.name || p.port === metricsPort?.containerPort)),
    `every ingress rule admits the metrics port (${metricsPort?.name}) only`);
  report.check(rules.length > 0 && rules.every((r) => (r.from ?? []).length > 0 &&
    r.from.every((f) => f.podSelector?.matchLabels?.["app.kubernetes.io/name"] === "prometheus")),
    "every ingress rule admits Prometheus' pods only (never all sources)");
}

const dp = objects.find((o) => o.object.kind === "ConfigMap" && o.file.includes("/nvidia/"));
if (report.check(!!dp, "deploy/nvidia/ holds the device plugin's time-slicing ConfigMap")) {
  for (const [key, text] of Object.entries(dp.object.data)) {
    const cfg = YAML.parse(text);
    const ts = cfg?.sharing?.timeSlicing;
    report.check(cfg?.version === "v1", `device plugin config ${key} is version v1`);
    report.check(ts?.failRequestsGreaterThanOne === true, `device plugin config ${key} sets failRequestsGreaterThanOne`);
    for (const r of ts?.resources ?? []) {
      report.check(Number.isInteger(r.replicas) && r.replicas >= 2 && r.replicas <= 256,
        `device plugin config ${key}: ${r.name} has 2-256 replicas (a GPU holds 256 Quanta tenants)`);
    }
    report.check((ts?.resources ?? []).length > 0, `device plugin config ${key} lists resources to time-slice`);
  }
}

for (const e of base.errors) report.fail(e);
report.finish();
