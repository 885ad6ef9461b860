// The PrometheusRule's groups through promtool: `promtool check rules` (syntax, templates)
// and `promtool test rules` with deploy/monitoring/tests/quanta-rules.test.yaml, whose
// series make every alert fire and its near misses stay silent. Every alert must have a
// test that expects it to fire.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import YAML from "yaml";
import { Report, loadYamlDocs, root, run } from "./lib.mjs";

const report = new Report("prometheus rules");
const rule = loadYamlDocs(path.join(root, "deploy/monitoring/prometheusrule.yaml"))[0].object;
const testFile = path.join(root, "deploy/monitoring/tests/quanta-rules.test.yaml");
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "quanta-rules-"));
fs.writeFileSync(path.join(dir, "rules.yaml"), YAML.stringify({ groups: rule.spec.groups }));
fs.copyFileSync(testFile, path.join(dir, "quanta-rules.test.yaml"));

const check = run("promtool", ["check", "rules", "rules.yaml"], { cwd: dir });
if (check.code === 127) {
  report.fail("promtool is not installed (Debian package prometheus; scripts/install-deps.sh installs it)");
  report.finish();
}
report.check(check.code === 0, `promtool check rules: ${(check.out + check.err).trim().split("\n").slice(-1)[0]}`);
if (check.code !== 0) console.log(check.out + check.err);
const test = run("promtool", ["test", "rules", "quanta-rules.test.yaml"], { cwd: dir });
report.check(test.code === 0, `promtool test rules: ${test.code === 0 ? "SUCCESS" : "FAILED"}`);
if (test.code !== 0) console.log(test.out + test.err);
fs.rmSync(dir, { recursive: true, force: true });

const alerts = rule.spec.groups.flatMap((g) => g.rules.filter((r) => r.alert).map((r) => r.alert));
const tests = YAML.parse(fs.readFileSync(testFile, "utf8")).tests;
for (const a of alerts) {
  const cases = tests.flatMap((t) => t.alert_rule_test ?? []).filter((c) => c.alertname === a);
  report.check(cases.some((c) => (c.exp_alerts ?? []).length > 0), `alert ${a} has a test in which it fires`);
  report.check(cases.some((c) => (c.exp_alerts ?? []).length === 0), `alert ${a} has a test in which it stays silent`);
}
for (const r of rule.spec.groups.flatMap((g) => g.rules)) {
  if (!r.alert) continue;
  report.check(["critical", "warning", "info"].includes(r.labels?.severity), `alert ${r.alert} has a severity`);
  report.check(!!r.annotations?.summary && !!r.annotations?.description, `alert ${r.alert} has a summary and a description`);
}
report.finish();
