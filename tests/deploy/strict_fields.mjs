// Unknown-field detection for Kubernetes objects, from the type declarations that ship
// with the schema models (the JSON schemas themselves accept unknown fields, which
// `kubectl apply` refuses under its default strict field validation). Walks an object
// along its interface declarations and reports every key the API does not define.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const cache = new Map();

function stripComments(text) {
  return text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/\/\/[^\n]*/g, "");
}

// Splits `{ "a"?: T; "b": {..}; }`'s inside into name -> type text (depth-0 semicolons).
function fields(body) {
  const out = new Map();
  let i = 0;
  while (i < body.length) {
    const m = body.slice(i).match(/^\s*"?([\w$-]+)"?\??:\s*/);
    if (!m) {
      const semi = body.indexOf(";", i);
      if (semi < 0) break;
      i = semi + 1;
      continue;
    }
    i += m[0].length;
    let depth = 0;
    let j = i;
    for (; j < body.length; j++) {
      const c = body[j];
      if (c === "{" || c === "<" || c === "(" || c === "[") depth++;
      else if (c === "}" || c === ">" || c === ")" || c === "]") depth--;
      else if (c === ";" && depth === 0) break;
    }
    out.set(m[1], body.slice(i, j).trim());
    i = j + 1;
  }
  return out;
}

function block(text, start) {
  let depth = 0;
  for (let j = start; j < text.length; j++) {
    if (text[j] === "{") depth++;
    else if (text[j] === "}" && --depth === 0) return text.slice(start + 1, j);
  }
  return "";
}

function load(file) {
  if (cache.has(file)) return cache.get(file);
  const text = stripComments(fs.readFileSync(file, "utf8"));
  const imports = new Map();
  for (const m of text.matchAll(/import\s*\{([^}]*)\}\s*from\s*"([^"]+)"/g)) {
    for (const name of m[1].split(",").map((s) => s.trim()).filter(Boolean)) imports.set(name, m[2]);
  }
  const iface = text.match(/export interface (\w+)(\s+extends\s+TypeMeta)?\s*\{/);
  let shape = { kind: "leaf" };
  if (iface) {
    const f = fields(block(text, iface.index + iface[0].length - 1));
    if (iface[2]) { f.set("apiVersion", "string"); f.set("kind", "string"); }
    shape = { kind: "object", fields: f, file, imports };
  }
  cache.set(file, shape);
  return shape;
}

function resolveImport(spec, fromFile) {
  if (spec.startsWith(".")) return path.resolve(path.dirname(fromFile), spec + ".d.ts");
  const base = require.resolve(spec.split("/").slice(0, spec.startsWith("@") ? 2 : 1).join("/") + "/package.json");
  const sub = spec.split("/").slice(spec.startsWith("@") ? 2 : 1).join("/");
  return path.join(path.dirname(base), sub + ".d.ts");
}

function typeShape(type, ctx) {
  type = type.trim();
  const arr = type.match(/^Array<([\s\S]*)>$/);
  if (arr) return { kind: "array", of: typeShape(arr[1], ctx) };
  if (type.startsWith("{")) {
    const inner = type.slice(1, -1);
    if (/^\s*\[key: string\]/.test(inner)) return { kind: "map" };
    return { kind: "object", fields: fields(inner), file: ctx.file, imports: ctx.imports };
  }
  if (/^\w+$/.test(type) && ctx.imports?.has(type)) return load(resolveImport(ctx.imports.get(type), ctx.file));
  return { kind: "leaf" };
}

// Unknown keys of `value` against the interface in `dtsFile`, as "path: key" strings.
export function unknownFields(value, dtsFile) {
  const out = [];
  const walk = (v, shape, where) => {
    if (v === null || v === undefined || shape.kind === "leaf" || shape.kind === "map") return;
    if (shape.kind === "array") {
      if (Array.isArray(v)) v.forEach((e, i) => walk(e, shape.of, `${where}[${i}]`));
      return;
    }
    if (typeof v !== "object" || Array.isArray(v)) return;
    for (const [k, child] of Object.entries(v)) {
      const t = shape.fields.get(k);
      if (t === undefined) {
        out.push(`${where || "(top)"}: unknown field "${k}"`);
        continue;
      }
      walk(child, typeShape(t, shape), where ? `${where}.${k}` : k);
    }
  };
  walk(value, load(dtsFile), "");
  return out;
}

// The declaration file of a kind's model, or null.
export function declarationFor(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  const spec = group === "monitoring.coreos.com"
    ? `@kubernetes-models/prometheus-operator/monitoring.coreos.com/${version}/${kind}`
    : group === "" ? `kubernetes-models/${version}/${kind}` : `kubernetes-models/${group}/${version}/${kind}`;
  try {
    const file = resolveImport(spec, import.meta.url);
    return fs.existsSync(file) ? file : null;
  } catch {
    return null;
  }
}
