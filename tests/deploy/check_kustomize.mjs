// deploy/ assembled as kustomize would build it: every resource and generator file listed
// exists, no object is defined twice, the image override reaches every container, and
// what the base references (ConfigMaps, the namespace) is part of it. Where a real
// kustomize is installed (`kustomize` or `kubectl kustomize`), its output must hold the
// same objects.
import path from "node:path";
import YAML from "yaml";
import { Report, assemble, podContainers, podSpec, rel, root, run, splitImage } from "./lib.mjs";

const report = new Report("kustomize base");
for (const dir of ["deploy", "deploy/node", "deploy/monitoring", "deploy/admission"]) {
  const { objects, errors } = assemble(path.join(root, dir));
  for (const e of errors) report.fail(e);
  report.check(objects.length > 0, `${dir} assembles into ${objects.length} objects`);
  const ids = objects.map((o) => `${o.object.apiVersion} ${o.object.kind} ${o.object.metadata?.namespace ?? ""}/${o.object.metadata?.name}`);
  const dup = ids.filter((id, i) => ids.indexOf(id) !== i);
  report.check(dup.length === 0, `${dir} defines every object once${dup.length ? ": twice " + dup.join(", ") : ""}`);
}

const { objects } = assemble(path.join(root, "deploy"));
const kinds = (k) => objects.filter((o) => o.object.kind === k).map((o) => o.object);
for (const k of ["Namespace", "ConfigMap", "DaemonSet", "PodMonitor", "PrometheusRule"]) {
  report.check(kinds(k).length > 0, `the base has a ${k}`);
}
// Everything a pod references is in the base.
const configMaps = new Set(kinds("ConfigMap").map((c) => `${c.metadata.namespace}/${c.metadata.name}`));
for (const w of objects.filter((o) => podSpec(o.object))) {
  const spec = podSpec(w.object);
  for (const v of spec.volumes ?? []) {
    if (v.configMap) {
      report.check(configMaps.has(`${w.object.metadata.namespace}/${v.configMap.name}`),
        `${w.object.kind}/${w.object.metadata.name} volume ${v.name} names ConfigMap ${v.configMap.name}, which the base defines in its namespace`);
    }
  }
  for (const c of podContainers(w.object)) {
    const [name, tag] = splitImage(c.image);
    report.check(name === "quanta-node" && tag === "0.2.0",
      `${w.object.kind}/${w.object.metadata.name} container ${c.name} image ${c.image} carries the base's image override`);
  }
}
const dashboard = kinds("ConfigMap").find((c) => c.metadata.name === "quanta-grafana-dashboard");
if (report.check(!!dashboard, "the dashboard ConfigMap is generated")) {
  report.check(dashboard.metadata.labels?.grafana_dashboard === "1", "the dashboard ConfigMap carries grafana_dashboard=1");
  try {
    JSON.parse(dashboard.data["quanta.json"]);
    report.ok("the generated dashboard is JSON");
  } catch (e) {
    report.fail(`the generated dashboard is not JSON: ${e.message}`);
  }
}

// A real kustomize, where one is installed.
const tools = [["kustomize", ["build"]], ["kubectl", ["kustomize"]]];
let used = "";
for (const [tool, args] of tools) {
  const r = run(tool, [...args, path.join(root, "deploy")]);
  if (r.code === 127) continue;
  used = tool;
  if (!report.check(r.code === 0, `${tool} ${args.join(" ")} deploy/ succeeds${r.code ? ": " + r.err.trim() : ""}`)) break;
  const real = YAML.parseAllDocuments(r.out).map((d) => d.toJS()).filter(Boolean);
  const key = (o) => `${o.kind} ${o.metadata?.namespace ?? ""}/${o.metadata?.name}`;
  const mine = objects.map((o) => key(o.object)).sort();
  const theirs = real.map(key).sort();
  report.check(JSON.stringify(mine) === JSON.stringify(theirs),
    `${tool} builds the same objects as the assembler (${theirs.join(", ")} vs ${mine.join(", ")})`);
  const realDs = real.find((o) => o.kind === "DaemonSet");
  const myDs = kinds("DaemonSet")[0];
  const canon = (v) => Array.isArray(v) ? v.map(canon) : v && typeof v === "object"
    ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, canon(v[k])])) : v;
  report.check(JSON.stringify(canon(realDs)) === JSON.stringify(canon(myDs)), `${tool}'s DaemonSet equals the assembler's`);
  for (const c of kinds("ConfigMap")) {
    const r = real.find((o) => o.kind === "ConfigMap" && o.metadata.name === c.metadata.name);
    report.check(r && JSON.stringify(canon(r)) === JSON.stringify(canon(c)), `${tool}'s ConfigMap ${c.metadata.name} equals the assembler's`);
  }
  break;
}
report.finish(used ? `also built by ${used}` : "no kustomize installed: assembler only");
