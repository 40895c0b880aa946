// node tests/deploy/k8s_validate.js MODELS_DIR < docs.json: validates Kubernetes objects (a JSON
// array, e.g. rendered overlays) offline against the Kubernetes OpenAPI schemas as npm's
// kubernetes-models package compiles them (types, required fields, enums, formats), and rejects
// fields the schema does not name (what `kubectl apply` refuses with strict field validation),
// read from the package's type declarations. Prints one line per problem; exit 1 if any.
"use strict";
const fs = require("fs");
const path = require("path");

const modelsDir = process.argv[2];
const root = path.join(modelsDir, "node_modules", "kubernetes-models");
const docs = JSON.parse(fs.readFileSync(0, "utf8"));
const problems = [];

// "apps/v1" + "Deployment" -> <root>/apps/v1/Deployment; "v1" -> <root>/v1/...
function modulePath(apiVersion, kind) {
  return path.join(root, ...apiVersion.split("/"), kind);
}

// The properties of the interface a module declares: {name: {module, array} | null}, where
// module is the declaration of the property's object type (null: a scalar, a map, or an inline
// type, whose own fields are not checked here).
const cache = new Map();
function properties(mod) {
  if (cache.has(mod)) return cache.get(mod);
  const text = fs.readFileSync(mod + ".d.ts", "utf8");
  const imports = {};
  for (const m of text.matchAll(/import \{ (\w+) \} from "([^"]+)";/g)) {
    const from = m[2].startsWith(".") ? path.resolve(path.dirname(mod), m[2])
                                      : path.join(modelsDir, "node_modules", m[2]);
    imports[m[1]] = from;
  }
  const body = text.match(/export interface \w+(?: extends [\w, ]+)? \{\n([\s\S]*?)\n\}/);
  if (!body) throw new Error("no interface in " + mod + ".d.ts");
  const props = {};
  // Top-level properties only: four spaces of indent (inline types indent deeper).
  for (const m of body[1].matchAll(/^ {4}"([^"]+)"\??: (.*?);?$/gm)) {
    const t = m[2].match(/^(Array<)?(I\w+)>?$/);
    props[m[1]] = t && imports[t[2]] ? {module: imports[t[2]], array: !!t[1]} : null;
  }
  // TypeMeta (apiVersion, kind) comes from the base class.
  if (/extends TypeMeta/.test(body[0])) props.apiVersion = props.kind = null;
  cache.set(mod, props);
  return props;
}

function checkFields(value, mod, where) {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return;
  const props = properties(mod);
  for (const [k, v] of Object.entries(value)) {
    if (!(k in props)) {
      problems.push(`${where}.${k}: unknown field`);
      continue;
    }
    const p = props[k];
    if (!p) continue;
    if (p.array && Array.isArray(v)) v.forEach((e, i) => checkFields(e, p.module, `${where}.${k}[${i}]`));
    else if (!p.array) checkFields(v, p.module, `${where}.${k}`);
  }
}

docs.forEach((doc, i) => {
  const name = `${doc.kind}/${doc.metadata && doc.metadata.name} (document ${i})`;
  const mod = modulePath(String(doc.apiVersion), String(doc.kind));
  if (!fs.existsSync(mod + ".js")) {
    problems.push(`${name}: no schema for apiVersion ${doc.apiVersion} kind ${doc.kind}`);
    return;
  }
  const Model = require(mod)[doc.kind];
  try {
    new Model(doc).validate();
  } catch (e) {
    problems.push(`${name}: ${e.message}`);
  }
  checkFields(doc, mod, name);
});
for (const p of problems) console.log(p);
console.log(`k8s_validate: ${docs.length} objects, ${problems.length} problems`);
process.exit(problems.length ? 1 : 0);
