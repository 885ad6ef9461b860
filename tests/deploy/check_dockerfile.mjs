// deploy/image/Dockerfile checked as far as no container engine is needed: stages and
// COPY --from refer to earlier stages, every build-context source exists, the binaries
// copied out of the build stage are targets it builds and CMake defines, the runtime stage
// installs no compiler, the paths the DaemonSet and the installer use are where the image
// puts them, the build stage's packages are the ones scripts/install-deps.sh installs, and
// the built binaries need no shared library the slim runtime image lacks.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Report, assemble, buildDir, podSpec, root, run } from "./lib.mjs";

const report = new Report("node image");
const file = path.join(root, "deploy/image/Dockerfile");
const lines = fs.readFileSync(file, "utf8").replace(/\\\n/g, " ").split("\n").map((l) => l.trim())
  .filter((l) => l && !l.startsWith("#"));
const args = new Map();
const stages = [];
const pending = [];
const subst = (s) => s.replace(/\$\{(\w+)\}|\$(\w+)/g, (m, a, b) => args.get(a ?? b) ?? m);
const cmakeTargets = new Set();
const walkCmake = (d) => {
  for (const e of fs.readdirSync(d, { withFileTypes: true })) {
    const p = path.join(d, e.name);
    if (e.isDirectory() && !/^(build|node_modules|\.git)/.test(e.name)) walkCmake(p);
    else if (e.name === "CMakeLists.txt") {
      for (const m of fs.readFileSync(p, "utf8").matchAll(/add_(?:executable|library)\(\s*([\w-]+)/g)) cmakeTargets.add(m[1]);
    }
  }
};
walkCmake(root);
// Parts of the layout other work adds: their absence is reported, not failed, until they land.
const kComing = new Map([["hooks", "quanta-hook"]]);
const coming = (what) => [...kComing].find(([dir, target]) => (what === dir || what === target) && !fs.existsSync(path.join(root, dir, "CMakeLists.txt")));

const kInstructions = new Set(["FROM", "ARG", "RUN", "COPY", "ADD", "WORKDIR", "ENV", "LABEL", "ENTRYPOINT", "CMD",
  "USER", "EXPOSE", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "SHELL", "ONBUILD"]);
for (const line of lines) {
  const [instr, ...rest] = line.split(/\s+/);
  const body = rest.join(" ");
  const stage = stages[stages.length - 1];
  report.check(kInstructions.has(instr.toUpperCase()), `${instr} is a Dockerfile instruction`);
  switch (instr.toUpperCase()) {
    case "ARG": {
      const [k, v] = body.split("=");
      if (!stage) args.set(k, v ?? "");
      break;
    }
    case "FROM": {
      const m = subst(body).match(/^(\S+)(?:\s+AS\s+(\S+))?$/i);
      report.check(!!m, `FROM ${body} parses`);
      stages.push({ image: m[1], name: m[2] ?? String(stages.length), lines: [], built: new Set(), copied: [] });
      break;
    }
    case "COPY": {
      const parts = body.split(/\s+/);
      const from = parts.find((p) => p.startsWith("--from="))?.slice(7);
      const paths = parts.filter((p) => !p.startsWith("--"));
      const sources = paths.slice(0, -1);
      const dest = paths[paths.length - 1];
      if (from) {
        const src = stages.find((s) => s.name === from);
        report.check(src && src !== stage, `COPY --from=${from} names an earlier stage`);
        for (const s of sources) {
          const target = s.match(/\/build\/(?:bin|lib)\/(?:lib)?([\w-]+?)(?:\.so)?$/)?.[1];
          if (src?.name === "build" && target) {
            report.check(src.built.has(target), `${s} is built by the build stage (--target ${target})`);
          }
          stage.copied.push({ source: s, dest });
        }
      } else {
        for (const s of sources) {
          const c = coming(s);
          if (!fs.existsSync(path.join(root, s)) && c) {
            pending.push(`${s}/ (${c[1]})`);
            continue;
          }
          report.check(fs.existsSync(path.join(root, s)), `COPY source ${s} exists in the repository`);
          stage.copied.push({ source: s, dest });
        }
      }
      break;
    }
    case "RUN": {
      stage.lines.push(body);
      const targets = body.match(/--target\s+([^&;]+)/)?.[1]?.trim().split(/\s+/) ?? [];
      for (const t of targets) {
        stage.built.add(t);
        if (!cmakeTargets.has(t) && coming(t)) { pending.push(`target ${t}`); continue; }
        report.check(cmakeTargets.has(t), `build target ${t} is defined in a CMakeLists.txt`);
      }
      break;
    }
    case "ENTRYPOINT": case "CMD": {
      const exe = JSON.parse(body)[0];
      report.check(stage.copied.some((c) => c.dest === exe || c.dest.endsWith("/") && exe === c.dest + path.basename(c.source)),
        `${instr} ${exe} is copied into the ${stage.name} stage`);
      break;
    }
    default:
      break;
  }
}
const runtime = stages[stages.length - 1];
const build = stages.find((s) => s.name === "build");
report.check(stages.length >= 3 && !!build, `the Dockerfile is multi-stage (${stages.map((s) => s.name).join(", ")})`);
report.check(/-slim$/.test(runtime.image), `the runtime stage is a slim image (${runtime.image})`);
report.check(!runtime.lines.some((l) => /apt-get install[^&]*\b(build-essential|gcc|g\+\+|clang|cmake|make)\b/.test(l)),
  "the runtime stage installs no compiler or build tool");
const inRuntime = (p) => runtime.copied.some((c) => c.dest === p || (c.dest.endsWith("/") && p === c.dest + path.basename(c.source)));

// The paths the DaemonSet runs and the installer reads are where the image puts them.
const { objects } = assemble(path.join(root, "deploy"));
const spec = podSpec(objects.find((o) => o.object.kind === "DaemonSet").object);
for (const c of [...spec.initContainers, ...spec.containers]) {
  report.check(inRuntime(c.command[0]), `container ${c.name}'s ${c.command[0]} is in the image`);
}
const installer = fs.readFileSync(path.join(root, "deploy/image/quanta-install-host"), "utf8");
const payload = installer.match(/^payload=(\S+)/m)[1];
const arbiter = installer.match(/^arbiter=(\S+)/m)[1];
report.check(inRuntime(arbiter), `the installer's ${arbiter} is in the image`);
for (const f of ["lib/libquanta.so", "bin/quanta-hook", "libexec/quanta-hook"]) {
  report.check(inRuntime(`${payload}/${f}`) || pending.length && f === "bin/quanta-hook" && coming("quanta-hook"),
    `the installer's payload ${payload}/${f} is in the image`);
}

// The build stage's packages are those install-deps.sh sets a machine up with.
const deps = fs.readFileSync(path.join(root, "scripts/install-deps.sh"), "utf8");
const known = new Set(deps.match(/packages=\(([\s\S]*?)\)/)[1].split(/\s+/).filter(Boolean));
const aptLine = build.lines.find((l) => l.includes("apt-get install")) ?? "";
for (const p of aptLine.split(/\s+/).filter((w) => /^[a-z0-9][a-z0-9.+-]+$/.test(w) && !["apt-get", "install", "update"].includes(w))) {
  if (["ca-certificates", "debian_frontend=noninteractive"].includes(p.toLowerCase())) continue;
  report.check(known.has(p), `build package ${p} is one scripts/install-deps.sh installs`);
}

// What the built binaries load: only libraries every Debian slim image has.
const kRuntimeLibs = /^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so/;
for (const b of ["bin/quanta-arbiter", "bin/quantactl", "bin/quanta-trace", "libexec/quanta-hook", "lib/libquanta.so"]) {
  const f = path.join(buildDir(), b);
  if (!fs.existsSync(f)) {
    if (b === "bin/quanta-hook" && coming("quanta-hook")) continue;
    report.fail(`${f} is not built`);
    continue;
  }
  const r = run("readelf", ["-d", f]);
  const needed = [...r.out.matchAll(/Shared library: \[([^\]]+)\]/g)].map((m) => m[1]);
  const extra = needed.filter((n) => !kRuntimeLibs.test(n));
  report.check(r.code === 0 && extra.length === 0, `${b} needs only glibc and the C++ runtime${extra.length ? " (also " + extra.join(", ") + ")" : ""}`);
}
// bin/quanta-hook, what runtimes start as host root, is static: no loader reads anything.
{
  const r = run("readelf", ["-l", "-d", path.join(buildDir(), "bin/quanta-hook")]);
  report.check(r.code === 0 && !/INTERP/.test(r.out) && !/Shared library/.test(r.out),
    "bin/quanta-hook (the hook runtimes start) has no program interpreter and loads no shared library");
}
// A real Dockerfile reader where one is installed: buildah splits the file into its stages
// and steps before it pulls the first base image, which is as far as it gets without a
// registry (none is reachable here); its stage count must be ours.
let buildah = "buildah not installed";
if (run("buildah", ["--version"]).code !== 127) {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "quanta-buildah-"));
  const b = run("timeout", ["120", "buildah", "--root", `${tmp}/root`, "--runroot", `${tmp}/run`, "--storage-driver", "vfs",
    "build", "-f", file, "-t", "quanta-node:parse-check", root]);
  fs.rmSync(tmp, { recursive: true, force: true });
  const text = b.out + b.err;
  const steps = text.match(/\[1\/(\d+)\] STEP 1\/(\d+)/);
  report.check(steps && Number(steps[1]) === stages.length,
    `buildah parses the Dockerfile into ${stages.length} stages${steps ? "" : ": " + text.trim().split("\n").slice(-2).join(" ")}`);
  buildah = b.code === 0 ? "buildah built the image" : "buildah parsed it; no registry to pull base images from";
}
report.finish([pending.length ? `waiting for ${[...new Set(pending)].join(", ")}` : "", buildah].filter(Boolean).join("; "));
