// Validates Gateway API objects against the schemas of @kubernetes-models/gateway-api (installed
// by scripts/ensure-gateway-api-models.sh into the directory given as the first argument).
// Reads a JSON array of objects on stdin; writes a JSON array of {kind, name, error} (error null
// when the object is valid).
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const models = join(process.argv[2], "node_modules", "@kubernetes-models", "gateway-api");
const docs = JSON.parse(readFileSync(0, "utf8"));
const results = [];
for (const doc of docs) {
  const [group, version] = doc.apiVersion.split("/");
  const file = pathToFileURL(join(models, group, version, `${doc.kind}.js`)).href;
  const module = await import(file);
  let error = null;
  try {
    new module[doc.kind](doc).validate();
  } catch (e) {
    error = String(e.message);
  }
  results.push({ kind: doc.kind, name: doc.metadata?.name ?? null, error });
}
process.stdout.write(JSON.stringify(results));
