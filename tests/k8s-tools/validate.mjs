// Validates Kubernetes objects against the official JSON schemas (kubernetes-models, offline).
// Reads a JSON list of objects on stdin; prints one line per object; exits 1 when any is invalid.
// Kinds the package does not know (custom resources such as TextGenerationService, ScaledObject,
// ServiceMonitor) are reported as skipped.
const input = JSON.parse(await new Promise((resolve) => {
  let data = "";
  process.stdin.on("data", (c) => (data += c));
  process.stdin.on("end", () => resolve(data));
}));
let invalid = 0;
for (const obj of input) {
  const [group, version] = obj.apiVersion.includes("/") ? obj.apiVersion.split("/") : ["", obj.apiVersion];
  const name = `${obj.kind} ${obj.metadata?.name ?? "?"}`;
  let mod;
  try {
    mod = await import(group ? `kubernetes-models/${group}/${version}` : `kubernetes-models/${version}`);
  } catch {
    mod = null;
  }
  const Model = mod?.[obj.kind];
  if (!Model) {
    console.log(`skipped ${obj.apiVersion} ${name} (no schema in kubernetes-models)`);
    continue;
  }
  try {
    new Model(obj).validate();
    console.log(`valid ${obj.apiVersion} ${name}`);
  } catch (e) {
    invalid++;
    console.log(`INVALID ${obj.apiVersion} ${name}: ${e.message}`);
  }
}
process.exit(invalid ? 1 : 0);
