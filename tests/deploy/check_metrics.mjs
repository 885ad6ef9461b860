// Every metric the alerting rules and the Grafana dashboard use is one the arbiter exports:
// a name in docs/metrics.md's catalogue (histograms through _bucket/_sum/_count), or one of
// the few external series named in lib.mjs. The dashboard's queries must also be PromQL that
// Prometheus parses (promtool check rules on them as recording rules) and every panel must
// be wired to the dashboard's datasource variable.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import YAML from "yaml";
import { Report, catalogue, familyOf, kExternalMetrics, loadYamlDocs, metricsIn, root, run } from "./lib.mjs";

const report = new Report("metrics used");
const cat = catalogue();
report.check(cat.size >= 20, `docs/metrics.md lists ${cat.size} metrics`);
const used = new Set();
const checkExpr = (where, expr) => {
  for (const name of metricsIn(expr)) {
    const family = familyOf(name, cat);
    if (family) used.add(family);
    report.check(family !== null || kExternalMetrics.has(name),
      `${where} uses ${name}, ${family ? "in the catalogue" : kExternalMetrics.has(name) ? "from " + kExternalMetrics.get(name) : "which the arbiter does not export (not in docs/metrics.md)"}`);
  }
};

const rule = loadYamlDocs(path.join(root, "deploy/monitoring/prometheusrule.yaml"))[0].object;
for (const g of rule.spec.groups) for (const r of g.rules) checkExpr(`rule ${r.alert ?? r.record}`, r.expr);

const dash = JSON.parse(fs.readFileSync(path.join(root, "deploy/monitoring/grafana/quanta.json"), "utf8"));
const grafanaVars = (e) => e.replace(/\$__rate_interval|\$__interval|\$__range/g, "5m").replace(/\$\{?(\w+)\}?/g, ".*");
const recording = [];
const panels = [];
const walk = (list) => { for (const p of list ?? []) { panels.push(p); walk(p.panels); } };
walk(dash.panels);
const ids = new Set();
for (const p of panels) {
  report.check(!ids.has(p.id), `panel id ${p.id} is unique`);
  ids.add(p.id);
  if (p.type === "row") continue;
  report.check(p.datasource?.uid === "${datasource}", `panel "${p.title}" uses the dashboard's datasource variable`);
  report.check((p.targets ?? []).length > 0, `panel "${p.title}" has queries`);
  for (const t of p.targets ?? []) {
    checkExpr(`panel "${p.title}"`, t.expr);
    recording.push({ record: `dashboard:panel${p.id}:${t.refId}`, expr: grafanaVars(t.expr) });
  }
}
for (const v of dash.templating.list) {
  if (v.type !== "query") continue;
  const q = typeof v.query === "string" ? v.query : v.query.query;
  const inner = q.match(/^label_values\((.*),\s*\w+\)$/)?.[1] ?? q;
  checkExpr(`variable $${v.name}`, inner);
  recording.push({ record: `dashboard:var:${v.name}`, expr: grafanaVars(inner) });
}
for (const label of ["node", "gpu", "namespace", "pod", "datasource"]) {
  report.check(dash.templating.list.some((v) => v.name === label), `the dashboard has a $${label} variable`);
}

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "quanta-dashboard-"));
fs.writeFileSync(path.join(dir, "dashboard.rules.yaml"), YAML.stringify({ groups: [{ name: "dashboard", rules: recording }] }));
const r = run("promtool", ["check", "rules", "dashboard.rules.yaml"], { cwd: dir });
report.check(r.code === 0, `promtool parses the dashboard's ${recording.length} queries${r.code ? ":\n" + r.out + r.err : ""}`);
fs.rmSync(dir, { recursive: true, force: true });

const unused = [...cat.keys()].filter((m) => !used.has(m));
report.finish(unused.length ? `catalogue metrics neither rules nor dashboard show: ${unused.join(", ")}` : "every catalogue metric is shown");
