// Helpers shared by the deploy/ checks: YAML loading, a kustomize-compatible assembly of a
// base, the schema models for every kind deploy/ uses, the metric catalogue of
// docs/metrics.md, metric names referenced by PromQL, and the simgpu node the live tests run.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { spawn, spawnSync } from "node:child_process";
import YAML from "yaml";

export const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
export const rel = (p) => path.relative(root, p);

// Collects failures and prints them; exit code 1 when any, 0 otherwise.
export class Report {
  constructor(name) {
    this.name = name;
    this.failures = [];
    this.checked = 0;
  }
  ok(what) {
    this.checked++;
    if (process.env.QUANTA_TEST_VERBOSE) console.log(`ok: ${what}`);
  }
  fail(what) {
    this.checked++;
    this.failures.push(what);
    console.log(`FAIL: ${what}`);
  }
  check(cond, what) {
    cond ? this.ok(what) : this.fail(what);
    return cond;
  }
  finish(note = "") {
    const passed = this.checked - this.failures.length;
    console.log(`${this.name}: ${passed} passed, ${this.failures.length} failed${note ? " (" + note + ")" : ""}`);
    process.exit(this.failures.length ? 1 : 0);
  }
}

// Every YAML document in a file, with the file and the document index for messages.
export function loadYamlDocs(file) {
  const text = fs.readFileSync(file, "utf8");
  const docs = YAML.parseAllDocuments(text);
  return docs.map((d, i) => {
    if (d.errors.length) throw new Error(`${rel(file)}: document ${i + 1}: ${d.errors[0].message}`);
    return { file, index: i, object: d.toJS() };
  }).filter((d) => d.object !== null && d.object !== undefined);
}

// Assembles a kustomization directory the way `kustomize build` does for the fields this
// repository uses (resources: files and directories, configMapGenerator with files,
// literals and options, images, namespace, commonLabels). Anything else is refused, so the
// emulation can never silently differ from kustomize. Returns {objects, errors}.
const kKnownFields = new Set(["apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions",
  "images", "namespace", "commonLabels"]);
export function assemble(dir, errors = [], seen = new Set()) {
  const kfile = ["kustomization.yaml", "kustomization.yml", "Kustomization"].map((n) => path.join(dir, n))
    .find((f) => fs.existsSync(f));
  if (!kfile) {
    errors.push(`${rel(dir)}: no kustomization.yaml`);
    return { objects: [], errors };
  }
  if (seen.has(kfile)) {
    errors.push(`${rel(kfile)}: included twice (cycle or diamond)`);
    return { objects: [], errors };
  }
  seen.add(kfile);
  const k = loadYamlDocs(kfile)[0]?.object ?? {};
  if (k.apiVersion !== "kustomize.config.k8s.io/v1beta1" || k.kind !== "Kustomization") {
    errors.push(`${rel(kfile)}: apiVersion/kind must be kustomize.config.k8s.io/v1beta1 Kustomization`);
  }
  for (const key of Object.keys(k)) {
    if (!kKnownFields.has(key)) errors.push(`${rel(kfile)}: field "${key}" is not one this assembler emulates`);
  }
  let objects = [];
  for (const r of k.resources ?? []) {
    const p = path.resolve(dir, r);
    if (!fs.existsSync(p)) {
      errors.push(`${rel(kfile)}: resource ${r} does not exist`);
    } else if (fs.statSync(p).isDirectory()) {
      objects.push(...assemble(p, errors, seen).objects);
    } else {
      for (const d of loadYamlDocs(p)) objects.push({ ...d, object: d.object });
    }
  }
  for (const g of k.configMapGenerator ?? []) {
    const options = { ...(k.generatorOptions ?? {}), ...(g.options ?? {}) };
    const cm = { apiVersion: "v1", kind: "ConfigMap", metadata: { name: g.name }, data: {} };
    if (g.namespace) cm.metadata.namespace = g.namespace;
    if (options.labels) cm.metadata.labels = { ...options.labels };
    if (options.annotations) cm.metadata.annotations = { ...options.annotations };
    for (const f of g.files ?? []) {
      const [key, file] = f.includes("=") ? f.split("=", 2) : [path.basename(f), f];
      const p = path.resolve(dir, file);
      if (!fs.existsSync(p)) errors.push(`${rel(kfile)}: configMapGenerator ${g.name} file ${file} does not exist`);
      else cm.data[key] = fs.readFileSync(p, "utf8");
    }
    for (const l of g.literals ?? []) {
      const eq = l.indexOf("=");
      cm.data[l.slice(0, eq)] = l.slice(eq + 1);
    }
    if (!options.disableNameSuffixHash) {
      errors.push(`${rel(kfile)}: configMapGenerator ${g.name} needs disableNameSuffixHash (the assembler does not compute kustomize's hash)`);
    }
    objects.push({ file: kfile, index: -1, object: cm });
  }
  if (k.namespace) {
    for (const o of objects) if (o.object.kind !== "Namespace") o.object.metadata.namespace = k.namespace;
  }
  if (k.commonLabels) {
    for (const o of objects) o.object.metadata.labels = { ...(o.object.metadata.labels ?? {}), ...k.commonLabels };
  }
  for (const img of k.images ?? []) {
    for (const o of objects) {
      for (const c of podContainers(o.object)) {
        const [name, tag] = splitImage(c.image);
        if (name !== img.name) continue;
        c.image = `${img.newName ?? name}${img.digest ? "@" + img.digest : ":" + (img.newTag ?? tag ?? "latest")}`;
      }
    }
  }
  return { objects, errors };
}

export function splitImage(image) {
  const at = image.indexOf("@");
  if (at >= 0) return [image.slice(0, at), null];
  const slash = image.lastIndexOf("/");
  const colon = image.lastIndexOf(":");
  return colon > slash ? [image.slice(0, colon), image.slice(colon + 1)] : [image, null];
}

export function podSpec(object) {
  const spec = object?.spec;
  if (!spec) return null;
  if (object.kind === "Pod") return spec;
  return spec.template?.spec ?? spec.jobTemplate?.spec?.template?.spec ?? null;
}

export function podContainers(object) {
  const s = podSpec(object);
  return s ? [...(s.initContainers ?? []), ...(s.containers ?? [])] : [];
}

// The schema model of a kind: kubernetes-models for the core API, the prometheus-operator
// models for monitoring.coreos.com. null for a kind neither knows.
export async function modelFor(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  try {
    if (group === "monitoring.coreos.com") {
      const m = await import(`@kubernetes-models/prometheus-operator/monitoring.coreos.com/${version}`);
      return m[kind] ?? null;
    }
    const module = group === "" ? `kubernetes-models/${version}` : `kubernetes-models/${group}/${version}`;
    const m = await import(module);
    return m[kind] ?? null;
  } catch {
    return null;
  }
}

// docs/metrics.md's catalogue: name -> {type, section}.
export function catalogue() {
  const text = fs.readFileSync(path.join(root, "docs/metrics.md"), "utf8");
  const out = new Map();
  let section = "";
  for (const line of text.split("\n")) {
    const h = line.match(/^##\s+(.*)/);
    if (h) section = h[1];
    const m = line.match(/^\|\s*`(quanta_[a-z0-9_]+)`\s*\|\s*(gauge|counter|histogram|summary)\s*\|/);
    if (m) out.set(m[1], { type: m[2], section });
  }
  return out;
}

// Metrics that are not Quanta's but that the rules and the dashboard may use, with where
// they come from (each is named in docs/operator-guide.md).
export const kExternalMetrics = new Map([["up", "Prometheus (one per scrape target)"]]);

const kPromqlWords = new Set([
  "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
  "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
  "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "day_of_month",
  "day_of_week", "day_of_year", "days_in_month", "delta", "deriv", "exp", "floor", "histogram_quantile",
  "holt_winters", "hour", "idelta", "increase", "irate", "label_join", "label_replace", "ln", "log2", "log10",
  "minute", "month", "predict_linear", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sqrt",
  "time", "timestamp", "vector", "year", "avg_over_time", "min_over_time", "max_over_time", "sum_over_time",
  "count_over_time", "quantile_over_time", "stddev_over_time", "stdvar_over_time", "last_over_time",
  "present_over_time", "label_values", "inf", "nan",
]);

// Metric names a PromQL expression selects: identifiers outside label matchers, grouping
// lists and strings that are not functions, operators or keywords.
export function metricsIn(expr) {
  let e = expr.replace(/"(?:[^"\\]|\\.)*"/g, '""').replace(/'(?:[^'\\]|\\.)*'/g, "''");
  e = e.replace(/\{[^}]*\}/g, "{}");
  e = e.replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, "$1()");
  e = e.replace(/\[[^\]]*\]/g, "[]");
  const names = new Set();
  for (const m of e.matchAll(/(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?!\w)/g)) {
    const word = m[1];
    const after = e.slice(m.index + word.length).trimStart();
    if (kPromqlWords.has(word) || kPromqlWords.has(word.toLowerCase())) continue;
    if (after.startsWith("(") && !after.startsWith("()")) continue;  // a function call
    if (/^\d/.test(word)) continue;
    names.add(word);
  }
  return names;
}

// A referenced series name resolved to its catalogue family (histogram _bucket/_sum/_count).
export function familyOf(name, cat) {
  if (cat.has(name)) return name;
  const m = name.match(/^(.*)_(bucket|sum|count)$/);
  if (m && cat.get(m[1])?.type === "histogram") return m[1];
  return null;
}

export function run(cmd, args, options = {}) {
  const r = spawnSync(cmd, args, { encoding: "utf8", ...options });
  return { code: r.status ?? (r.error ? 127 : 128), out: r.stdout ?? "", err: (r.stderr ?? "") + (r.error ? String(r.error) : "") };
}

export function buildDir() {
  return process.env.QUANTA_BUILD_DIR ?? path.join(root, "build");
}

// Every YAML file under deploy/ that holds Kubernetes objects (not kustomizations, not
// promtool tests, not config snippets).
export function manifestFiles() {
  const out = [];
  const walk = (d) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) { if (e.name !== "tests") walk(p); continue; }
      if (!/\.ya?ml$/.test(e.name) || /^kustomization\.ya?ml$/.test(e.name)) continue;
      out.push(p);
    }
  };
  walk(path.join(root, "deploy"));
  return out.sort();
}

// Every series name the alerting rules and the dashboard select, with where: name -> [where].
export function metricsUsedByRulesAndDashboard() {
  const out = new Map();
  const add = (where, expr) => {
    for (const n of metricsIn(expr)) out.set(n, [...(out.get(n) ?? []), where]);
  };
  const rule = loadYamlDocs(path.join(root, "deploy/monitoring/prometheusrule.yaml"))[0].object;
  for (const g of rule.spec.groups) for (const r of g.rules) add(`rule ${r.alert ?? r.record}`, r.expr);
  const dash = JSON.parse(fs.readFileSync(path.join(root, "deploy/monitoring/grafana/quanta.json"), "utf8"));
  const walk = (list) => {
    for (const p of list ?? []) {
      for (const t of p.targets ?? []) add(`panel "${p.title}"`, t.expr);
      walk(p.panels);
    }
  };
  walk(dash.panels);
  for (const v of dash.templating.list) {
    if (v.type !== "query") continue;
    const q = typeof v.query === "string" ? v.query : v.query.query;
    add(`variable $${v.name}`, q.match(/^label_values\((.*),\s*\w+\)$/)?.[1] ?? q);
  }
  return out;
}

// Label names an expression (and its legend or annotation templates) relies on.
export function labelsIn(text) {
  const out = new Set();
  for (const m of text.matchAll(/\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)/g)) {
    for (const l of m[1].split(",").map((s) => s.trim()).filter(Boolean)) out.add(l);
  }
  for (const m of text.matchAll(/\{([^}]*)\}/g)) {
    for (const x of m[1].matchAll(/([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)/g)) out.add(x[1]);
  }
  for (const m of text.matchAll(/\$labels\.(\w+)/g)) out.add(m[1]);
  for (const m of text.matchAll(/\{\{\s*(\w+)\s*\}\}/g)) out.add(m[1]);
  return out;
}

// Every label name the rules (expressions and annotations) and the dashboard (queries and
// legends) use.
export function labelsUsedByRulesAndDashboard() {
  const out = new Set();
  const rule = loadYamlDocs(path.join(root, "deploy/monitoring/prometheusrule.yaml"))[0].object;
  for (const g of rule.spec.groups) {
    for (const r of g.rules) {
      for (const l of labelsIn(r.expr)) out.add(l);
      for (const a of Object.values(r.annotations ?? {})) for (const l of labelsIn(a)) out.add(l);
    }
  }
  const dash = JSON.parse(fs.readFileSync(path.join(root, "deploy/monitoring/grafana/quanta.json"), "utf8"));
  const walk = (list) => {
    for (const p of list ?? []) {
      for (const t of p.targets ?? []) for (const l of labelsIn(t.expr + " " + (t.legendFormat ?? ""))) out.add(l);
      walk(p.panels);
    }
  };
  walk(dash.panels);
  return out;
}

// A node for the live tests: a scratch folder and quanta.toml for an arbiter on simgpu that
// admits development processes (QUANTA_POD), `nodeKeys` more [node] keys and `tables`
// after it; `start` runs a process in the node's environment (simgpu, the tenant socket,
// no other QUANTA_* variable) keeping the tail of its output; `cleanup` kills what is left
// and removes simgpu's and the arbiter's memory and the folder.
export function simNode(prefix, { build, nodeKeys = "", tables = "", simEnv = {} }) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `quanta-${prefix}-`));
  const scope = `q${prefix}${process.pid}`;
  const sim = `quanta-${prefix}-${process.pid}`;
  fs.writeFileSync(path.join(dir, "quanta.toml"), `[node]
scope = "${scope}"
tenant_socket = "${dir}/tenant.sock"
admin_socket = "${dir}/admin.sock"
state_dir = "${dir}/state"
allow_unregistered = true
${nodeKeys}${tables}`);
  const env = { ...process.env, LD_LIBRARY_PATH: path.join(build, "sim"), SIMGPU_STATE: sim, ...simEnv,
    QUANTA_SOCKET: `${dir}/tenant.sock` };
  for (const k of Object.keys(env)) if (k.startsWith("QUANTA_") && k !== "QUANTA_SOCKET") delete env[k];
  const children = [];
  const start = (args, extra, name) => {
    const c = spawn(args[0], args.slice(1), { env: { ...env, ...extra }, stdio: ["ignore", "pipe", "pipe"] });
    c.name = name;
    c.log = "";
    c.stdout.on("data", (d) => (c.log = (c.log + d).slice(-20000)));
    c.stderr.on("data", (d) => (c.log = (c.log + d).slice(-20000)));
    c.exited = new Promise((r) => c.on("exit", r));
    children.push(c);
    return c;
  };
  const cleanup = () => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) { c.kill("SIGCONT"); c.kill("SIGKILL"); }
    for (const f of fs.readdirSync("/dev/shm")) if (f.startsWith(scope + ".") || f.startsWith(sim)) fs.rmSync(`/dev/shm/${f}`, { force: true });
    fs.rmSync(dir, { recursive: true, force: true });
  };
  return { dir, scope, sim, env, children, start, cleanup, config: path.join(dir, "quanta.toml") };
}
