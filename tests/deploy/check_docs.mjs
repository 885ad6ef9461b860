// The documentation agrees with the code. `config`: every key the node-config parser
// accepts is documented in config/quanta.toml under its section, nothing documented there
// is refused, and every `[section] key` the docs name exists. `metrics`: every quanta_*
// name in the docs and deploy/ is in docs/metrics.md, which lists each once. `annotations`:
// every quanta.dev/* annotation the docs and the example pods use is one the annotation
// parser accepts (apply_policy_value, which quanta-hook and `quantactl set` share), each
// is defined by exactly one table row in docs/, and the examples' values pass it. `alerts`: the operator guide's alert table lists exactly the rules.
// `results`: every results/<file>.md or .json that README.md, SECURITY.md, docs/, bench/ and
// bench/results/ cite is in bench/results/ (a path given to a recorded command's option,
// `--results FILE`, is what that run wrote, not a citation); it needs no build.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { spawn } from "node:child_process";
import { Report, buildDir, catalogue, familyOf, loadYamlDocs, root, run } from "./lib.mjs";

const mode = process.argv[2];
const report = new Report(`docs: ${mode}`);
const arbiter = path.join(buildDir(), "bin/quanta-arbiter");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "quanta-docs-"));
process.on("exit", () => fs.rmSync(tmp, { recursive: true, force: true }));

const docFiles = () => {
  const out = [path.join(root, "README.md"), path.join(root, "SECURITY.md")];
  for (const f of fs.readdirSync(path.join(root, "docs"))) if (f.endsWith(".md")) out.push(path.join(root, "docs", f));
  const walk = (d) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (/\.(md|ya?ml|json|toml)$/.test(e.name) || e.name === "quanta-install-host") out.push(p);
    }
  };
  walk(path.join(root, "deploy"));
  return out.filter((f) => fs.existsSync(f));
};
const text = (f) => fs.readFileSync(f, "utf8");
const relp = (f) => path.relative(root, f);

// What the parser accepts, asked of the parser itself: an unknown key in each section makes
// --check-config list the allowed ones.
function acceptedKeys() {
  if (!report.check(fs.existsSync(arbiter), `${arbiter} is built`)) report.finish();
  const probe = (toml) => {
    const f = path.join(tmp, "probe.toml");
    fs.writeFileSync(f, toml);
    const r = run(arbiter, ["--check-config", "--config", f]);
    const m = (r.out + r.err).match(/allowed keys are (.*)$/m);
    if (!m) report.fail(`--check-config did not list the allowed keys for:\n${toml}\n${r.out}${r.err}`);
    return m ? m[1].split(/,\s*/) : [];
  };
  const sections = new Map();
  sections.set("", probe("quanta_doc_probe = 1\n"));
  for (const s of sections.get("")) {
    if (s === "pod" || s === "namespace") sections.set(s, probe(`[${s}."probe"]\nquanta_doc_probe = 1\n`));
    else sections.set(s, probe(`[${s}]\nquanta_doc_probe = 1\n`));
  }
  return sections;
}

if (mode === "config") {
  const accepted = acceptedKeys();
  report.check(accepted.get("").length >= 5, `the parser's sections: ${accepted.get("").join(", ")}`);
  // config/quanta.toml, key by key: `key = ...` or `# key = ...` under `[section]`,
  // `# [pod."NAME"]` or `# [namespace."NAME"]`.
  const documented = new Map();
  let section = "";
  for (const line of text(path.join(root, "config/quanta.toml")).split("\n")) {
    const h = line.match(/^#?\s*\[(\w+)(?:\."[^"]*")?\]\s*$/);
    if (h) { section = h[1]; continue; }
    const k = line.match(/^#?\s*([a-z_]+)\s*=/);
    if (k) documented.set(section, new Set([...(documented.get(section) ?? []), k[1]]));
  }
  for (const [s, keys] of accepted) {
    if (s === "") continue;
    for (const k of keys) {
      report.check(documented.get(s)?.has(k), `[${s}] ${k} is documented in config/quanta.toml`);
    }
  }
  for (const [s, keys] of documented) {
    for (const k of keys) {
      const ok = accepted.get(s)?.includes(k);
      report.check(ok, `config/quanta.toml documents [${s}] ${k}, which the parser ${ok ? "accepts" : "refuses"}`);
    }
  }
  // `[section] key` named anywhere in the docs.
  for (const f of docFiles()) {
    for (const m of text(f).matchAll(/`\[(\w+)\] ([a-z_]+)/g)) {
      const ok = accepted.get(m[1])?.includes(m[2]);
      report.check(ok, `${relp(f)} names [${m[1]}] ${m[2]}, which the parser ${ok ? "accepts" : "does not accept"}`);
    }
  }
}

if (mode === "metrics") {
  const cat = catalogue();
  const rows = [...text(path.join(root, "docs/metrics.md")).matchAll(/^\|\s*`(quanta_[a-z0-9_]+)`\s*\|/gm)].map((m) => m[1]);
  const dup = rows.filter((r, i) => rows.indexOf(r) !== i);
  report.check(dup.length === 0, `docs/metrics.md lists each metric once${dup.length ? " (twice: " + dup.join(", ") + ")" : ""}`);
  for (const f of docFiles()) {
    if (f.endsWith("docs/metrics.md")) continue;
    for (const m of new Set([...text(f).matchAll(/\bquanta_[a-z0-9_]*[a-z0-9]\b/g)].map((x) => x[0]))) {
      if (/^quanta_(arbiter_core|shim|bpf|cuda|log|toml|common|policy|integration)/.test(m)) continue;  // CMake targets
      report.check(familyOf(m, cat) !== null, `${relp(f)} names ${m}, ${familyOf(m, cat) ? "in" : "which is not in"} docs/metrics.md`);
    }
  }
}

if (mode === "annotations") {
  // The keys the annotation parser accepts, asked of it: quanta-hook and `quantactl set`
  // both go through the arbiter's apply_policy_value, which lists them for an unknown key.
  // A short-lived arbiter on simgpu answers the `set` (for a pod its table names: `set` takes
  // only pods the arbiter knows).
  const quantactl = path.join(buildDir(), "bin/quantactl");
  const scope = `qdocs${process.pid}`;
  const sim = `quanta-docs-${process.pid}`;
  fs.writeFileSync(path.join(tmp, "arbiter.toml"), `[node]\nscope = "${scope}"\ntenant_socket = "${tmp}/t.sock"\n` +
    `admin_socket = "${tmp}/a.sock"\nstate_dir = "${tmp}/state"\n[pod."docs/probe"]\nweight = 1\n`);
  const env = { ...process.env, LD_LIBRARY_PATH: path.join(buildDir(), "sim"), SIMGPU_STATE: sim };
  const daemon = spawn(arbiter, ["--foreground", "--config", path.join(tmp, "arbiter.toml")], { env, stdio: "ignore" });
  let answer = "";
  for (let i = 0; i < 100; i++) {
    const r = run(quantactl, ["--admin-socket", `${tmp}/a.sock`, "set", "docs/probe", "quanta.dev/quanta-doc-probe=1"]);
    answer = r.out + r.err;
    if (/allowed keys are/.test(answer)) break;
    run("sleep", ["0.05"]);
  }
  daemon.kill("SIGKILL");
  for (const f of fs.readdirSync("/dev/shm")) if (f.startsWith(scope + ".") || f.startsWith(sim)) fs.rmSync(`/dev/shm/${f}`, { force: true });
  const listed = answer.match(/allowed keys are (.*)$/m)?.[1]?.split(/,\s*/) ?? [];
  if (!report.check(listed.length > 0, `the annotation parser lists its keys (quantactl set said: ${answer.trim()})`)) report.finish();
  const accepted = new Set(listed);
  const source = "the annotation parser";
  accepted.delete("gpu");  // quanta.dev/gpu is the CDI kind, not an annotation
  const defined = new Map();
  for (const f of docFiles()) {
    // Lines that quote a refusal of an unknown key show that key on purpose.
    const body = text(f).split("\n").filter((l) => !l.includes("unknown policy key")).join("\n");
    for (const m of body.matchAll(/quanta\.dev\/([a-z][a-z-]*)/g)) {
      // quanta.dev/trusted is a namespace label (deploy/admission/), not a pod annotation.
      if (m[1] === "gpu" || m[1] === "trusted") continue;
      report.check(accepted.has(m[1]), `${relp(f)} uses quanta.dev/${m[1]}, which ${source} ${accepted.has(m[1]) ? "accepts" : "does not accept"}`);
    }
    if (!f.includes(`${path.sep}docs${path.sep}`)) continue;
    for (const m of text(f).matchAll(/^\|\s*`quanta\.dev\/([a-z-]+)`\s*\|/gm)) {
      defined.set(m[1], [...(defined.get(m[1]) ?? []), relp(f)]);
    }
  }
  for (const k of accepted) {
    const where = defined.get(k) ?? [];
    report.check(where.length === 1, `quanta.dev/${k} is defined by one table row in docs/ (${where.length ? where.join(", ") : "none"})`);
  }
  // The example pods' values go through the same parsers, as a [pod."…"] table.
  for (const f of fs.readdirSync(path.join(root, "deploy/examples"))) {
    for (const { object } of loadYamlDocs(path.join(root, "deploy/examples", f))) {
      const ann = Object.entries(object.metadata?.annotations ?? {}).filter(([k]) => k.startsWith("quanta.dev/"));
      report.check(ann.length > 0, `deploy/examples/${f} sets quanta.dev/* annotations`);
      const toml = `[pod."${object.metadata.name}"]\n` +
        ann.map(([k, v]) => `${k.slice("quanta.dev/".length).replace(/-/g, "_")} = ${JSON.stringify(String(v))}`).join("\n") + "\n";
      const file = path.join(tmp, "example.toml");
      fs.writeFileSync(file, toml);
      const r = run(arbiter, ["--check-config", "--config", file]);
      report.check(r.code === 0, `deploy/examples/${f}'s annotation values pass the policy parsers${r.code ? ": " + r.err.trim() : ""}`);
    }
  }
}

if (mode === "alerts") {
  const rule = loadYamlDocs(path.join(root, "deploy/monitoring/prometheusrule.yaml"))[0].object;
  const alerts = rule.spec.groups.flatMap((g) => g.rules.filter((r) => r.alert).map((r) => r.alert));
  const guide = text(path.join(root, "docs/operator-guide.md"));
  const rows = [...guide.matchAll(/^\|\s*`(Quanta\w+)`\s*\|/gm)].map((m) => m[1]);
  for (const a of alerts) report.check(rows.filter((r) => r === a).length === 1, `docs/operator-guide.md's alert table lists ${a} once`);
  for (const r of rows) report.check(alerts.includes(r), `docs/operator-guide.md lists ${r}, which is a rule`);
}

if (mode === "versions") {
  // The upgrade guide's versions table: this release's row is what common/version.h lists
  // and what the built arbiter's --version prints.
  const header = text(path.join(root, "common/version.h"));
  const constant = (file, name) => Number((text(path.join(root, file)).match(new RegExp(`${name}\\s*=\\s*(\\d+)`)) ?? [])[1]);
  const wire = constant("common/wire.h", "kWireVersion");
  const layout = constant("common/shm_layout.h", "kLayoutVersion");
  const range = (name, speaks) => {
    const m = header.match(new RegExp(`${name}\\{"[^"]+",\\s*\\w+,\\s*(\\d+),\\s*(\\d+)\\}`));
    if (!m) return "?";
    const [oldest, newest] = [Number(m[1]), Number(m[2])];
    return `${speaks}; ${oldest === newest ? oldest : `${oldest} to ${newest}`}`;
  };
  const release = (text(path.join(root, "CMakeLists.txt")).match(/project\(quanta VERSION ([0-9.]+)/) ?? [])[1];
  const row = `| ${release} | ${range("kTenantProtocol", wire)} | ${range("kSharedMemoryLayout", layout)} |`;
  const guide = text(path.join(root, "docs/operator-guide.md"));
  report.check(guide.split("\n").some((l) => l.trim() === row), `docs/operator-guide.md's versions table has the row ${row}`);
  if (fs.existsSync(arbiter)) {
    const r = run(arbiter, ["--version"]);
    report.check(r.out.includes(`${release} (shared-memory layout ${layout}, tenant protocol ${wire})`),
      `quanta-arbiter --version says release ${release}, layout ${layout}, protocol ${wire} (got ${r.out.trim()})`);
  }
}

if (mode === "results") {
  // Dated runs keep a summary and only some keep their JSON, so a page can point at a file
  // that is gone. Each citation is named with its file and line.
  const dir = path.join(root, "bench/results");
  const kept = new Set(fs.readdirSync(dir));
  const pages = [path.join(root, "README.md"), path.join(root, "SECURITY.md")];
  for (const d of ["docs", "bench", "bench/results"]) {
    for (const f of fs.readdirSync(path.join(root, d)).sort()) if (f.endsWith(".md")) pages.push(path.join(root, d, f));
  }
  let cited = 0;
  for (const f of pages.filter((p) => fs.existsSync(p))) {
    const body = text(f);
    for (const m of body.matchAll(/results\/([A-Za-z0-9._-]+\.(?:md|json))/g)) {
      const before = body.slice(0, m.index);
      if (/--[a-z][a-z-]*\s+$/.test(before.replace(/\S*$/, ""))) continue;  // a command's argument
      const line = before.split("\n").length;
      cited++;
      report.check(kept.has(m[1]), `${relp(f)}:${line} cites ${m[0]}, which ${kept.has(m[1]) ? "is" : "is not"} in bench/results/`);
    }
  }
  report.check(cited > 0, `the pages cite bench/results/ files (${cited} citations)`);
}

if (!["config", "metrics", "annotations", "alerts", "versions", "results"].includes(mode)) {
  report.fail(`usage: check_docs.mjs config|metrics|annotations|alerts|versions|results (got ${mode})`);
}
report.finish();
