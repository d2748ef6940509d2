#!/usr/bin/env python3
"""textgen-operator against a real API server (kube_server.py: apiextensions-apiserver + etcd).

Usage: operator_test.py OPERATOR_BINARY SHARD_BINARY ROUTER_BINARY MODELS_DIR
Covers: the CRD installs and rejects invalid specs (its CEL rules among them); a resource yields the
expected objects with owner references, labels and env (a shard pod is one container in which
textgen-launcher --shards-only runs its ranks; a replica is one pod or several); a second pass writes nothing; status conditions follow the children's
(simulated) readiness; the scale subresource adds and removes replicas; a spec edit rolls them; a
rank's restart deletes every pod of its replica (and only those), and outdated replicas are replaced
one whole replica at a time; KEDA scaling to zero (its CRD installed); an InferencePool before and after its CRD is
served; the Events it records, and that a steady pass records none and reads no owned kind from the server; a watch
expired by an etcd compaction is recovered by a relist; with two operators only the
Lease holder reconciles and the other takes over when it dies; deletion cleans up. Finally, without
a kubelet: the StatefulSets and router Deployment the operator wrote are run as local processes
(their commands and env as the pod specs say, the model volume mapped to MODELS_DIR, Service and
pod DNS names mapped to 127.0.0.1 ports through the Services' selectors; the shard pods' launcher
is the build directory's, beside SHARD_BINARY) and serve a generation.
Prints "N passed, M failed" and exits non-zero on any failure.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_server import REPO, KubeTestServer, free_port  # noqa: E402

OPERATOR, SHARD, ROUTER, MODELS = sys.argv[1:5]
LAUNCHER = os.path.join(os.path.dirname(SHARD), "textgen-launcher")  # built beside the shard
NS = "default"
TGS = f"/apis/textgen.dev/v1alpha1/namespaces/{NS}/textgenerationservices"
STS = f"/apis/apps.textgen.test/v1/namespaces/{NS}/statefulsets"
DEPLOY = f"/apis/apps.textgen.test/v1/namespaces/{NS}/deployments"
SVC = f"/apis/core.textgen.test/v1/namespaces/{NS}/services"
PVC = f"/apis/core.textgen.test/v1/namespaces/{NS}/persistentvolumeclaims"
POD = f"/apis/core.textgen.test/v1/namespaces/{NS}/pods"
HPA = f"/apis/autoscaling.textgen.test/v2/namespaces/{NS}/horizontalpodautoscalers"
PDB = f"/apis/policy.textgen.test/v1/namespaces/{NS}/poddisruptionbudgets"
EVENTS = f"/apis/core.textgen.test/v1/namespaces/{NS}/events"
SCALED = f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects"
POOLS = f"/apis/inference.networking.k8s.io/v1/namespaces/{NS}/inferencepools"
CRDS = os.path.join(REPO, "tests", "k8s-crds")
TOOLS = os.path.join(REPO, "tests", "k8s-tools")
# The kinds the operator owns, as the API server's request metrics name them (group, resource).
OWNED = {("apps.textgen.test", "statefulsets"), ("apps.textgen.test", "deployments"),
         ("core.textgen.test", "services"), ("core.textgen.test", "persistentvolumeclaims"),
         ("core.textgen.test", "pods"), ("autoscaling.textgen.test", "horizontalpodautoscalers"),
         ("policy.textgen.test", "poddisruptionbudgets"), ("keda.sh", "scaledobjects"),
         ("inference.networking.k8s.io", "inferencepools")}
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/textgen-operator"
results = {"passed": 0, "failed": 0}


def check(cond, what):
    results["passed" if cond else "failed"] += 1
    if not cond:
        print("FAIL:", what, flush=True)
    return cond


def wait_for(what, fn, timeout=30):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.2)
    check(False, f"timed out waiting for {what} (last: {str(last)[:300]})")
    return None


class Operator:
    def __init__(self, server, name):
        self.port = free_port()
        self.log = open(os.path.join(server.dir, f"{name}.log"), "w+")
        self.proc = subprocess.Popen(
            [OPERATOR, "--kubeconfig", server.kubeconfig, "--test-api-groups", "--image", "textgen:test",
             "--metrics-port", str(self.port), "--lease-seconds", "3", "--watch-seconds", "3",
             "--crd-recheck-seconds", "2"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def metrics(self):
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()
        except OSError:
            return {}
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                if line and not line.startswith("#")}

    def leading(self):
        return self.metrics().get("textgen_operator_leader") == 1

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.returncode


def items(server, path):
    code, body = server.request("GET", path)
    return {i["metadata"]["name"]: i for i in body.get("items", [])} if code == 200 else {}


def get(server, path):
    code, body = server.request("GET", path)
    return body if code == 200 else None


def condition(obj, type_):
    for c in ((obj or {}).get("status") or {}).get("conditions", []):
        if c["type"] == type_:
            return c
    return {}


def service(name, **spec):
    body = {"model": {"id": "meta-llama/Llama-2-7b-hf", "revision": "main",
                      "hfTokenSecret": {"name": "hf"}},
            "shards": 2, "replicas": 2, "dtype": "bfloat16",
            "router": {"maxInputTokens": 1024, "maxTotalTokens": 2048, "apiKeySecret": {"name": "api"}},
            "autoscaling": {"minReplicas": 1, "maxReplicas": 4, "targetQueueSizePerReplica": 6},
            "nodeSelector": {"gpu": "h100"}, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}
    body.update(spec)
    return {"apiVersion": "textgen.dev/v1alpha1", "kind": "TextGenerationService",
            "metadata": {"name": name, "namespace": NS}, "spec": body}


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def mark_ready(server, tgs_name, replicas, pods, revision=None):
    """What the StatefulSet and Deployment controllers would report once every pod is ready."""
    for r in range(replicas):
        sts = get(server, f"{STS}/{tgs_name}-shard-{r}")
        if sts:
            status = {"replicas": pods, "readyReplicas": pods, "updatedReplicas": pods,
                      "observedGeneration": sts["metadata"]["generation"]}
            if revision:
                status["updateRevision"] = revision
            server.merge(f"{STS}/{tgs_name}-shard-{r}/status", {"status": status})
    server.merge(f"{DEPLOY}/{tgs_name}-router/status", {"status": {"replicas": 1, "readyReplicas": 1}})


def test_crd(server):
    crd = yaml.safe_load(open(os.path.join(REPO, "charts/textgen/crds/textgen.dev_textgenerationservices.yaml")))
    server.install_crd(crd)
    name = crd["metadata"]["name"]
    got = get(server, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
    conds = {c["type"]: c["status"] for c in (got.get("status") or {}).get("conditions") or []}
    check(conds.get("Established") == "True" and conds.get("NamesAccepted") == "True",
          f"CRD installs: Established and NamesAccepted ({conds})")
    served = {r["name"]: r for r in (get(server, "/apis/textgen.dev/v1alpha1") or {}).get("resources", [])}
    tgs = served.get("textgenerationservices", {})
    check(tgs.get("kind") == "TextGenerationService" and tgs.get("namespaced") is True and
          "tgs" in tgs.get("shortNames", []) and
          {"textgenerationservices/status", "textgenerationservices/scale"} <= set(served),
          f"discovery serves the kind, its short name and the status and scale subresources: {sorted(served)} {tgs}")
    invalid = [("shards 0", service("bad", shards=0)),
               ("shardsPerPod 0", service("bad", shardsPerPod=0)),
               ("shardsPerPod above shards", service("bad", shards=2, shardsPerPod=4)),
               ("shardsPerPod not dividing shards", service("bad", shards=4, shardsPerPod=3)),
               ("shardsPerPod 2 of the default 1 shard", service("bad", shards=None, shardsPerPod=2)),
               ("shardEnv sets RANK", service("bad", shardEnv=[{"name": "RANK", "value": "3"}])),
               ("shardEnv turns NVLink multicast on",
                service("bad", shardEnv=[{"name": "NCCL_NVLS_ENABLE", "value": "1"}])),
               ("shardEnv value and valueFrom", service("bad", shardEnv=[
                   {"name": "NCCL_DEBUG", "value": "INFO", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}])),
               ("shardEnv names a variable twice", service("bad", shardEnv=[
                   {"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_DEBUG", "value": "WARN"}])),
               ("no model", {"apiVersion": "textgen.dev/v1alpha1", "kind": "TextGenerationService",
                             "metadata": {"name": "bad"}, "spec": {"replicas": 1}}),
               ("bad dtype", service("bad", dtype="float8")),
               ("quantize exl2", service("bad", quantize="exl2")),
               ("quantize a number", service("bad", quantize=4)),
               ("bad kvCacheDtype", service("bad", kvCacheDtype="fp8")),
               ("min > max replicas", service("bad", autoscaling={"minReplicas": 5, "maxReplicas": 2})),
               ("input >= total", service("bad", router={"maxInputTokens": 10, "maxTotalTokens": 10})),
               ("KEDA without prometheus", service("bad", autoscaling={"maxReplicas": 2, "mode": "KEDA"})),
               ("revision with a PVC", service("bad", model={"id": "m", "revision": "r", "pvc": {"claimName": "c"}})),
               ("HPA to zero", service("bad", autoscaling={"minReplicas": 0, "maxReplicas": 2})),
               ("negative minReplicas", service("bad", autoscaling={"minReplicas": -1, "maxReplicas": 2,
                                                                    "mode": "KEDA", "prometheusAddress": "http://p"})),
               ("InferencePool without a picker", service("bad", inferencePool={"enabled": True})),
               ("tracing to an ftp URL", service("bad", tracing={"otlpEndpoint": "ftp://otel:4317"})),
               ("tracing to a path", service("bad", tracing={"otlpEndpoint": "http://otel:4317/v1/traces"})),
               ("tracing service name with a space", service("bad", tracing={"otlpEndpoint": "otel:4317",
                                                                             "serviceName": "a b"})),
               ("picker Service without a port", service("bad", inferencePool={"endpointPickerRef": {"name": "epp"}})),
               ("picker failureMode", service("bad", inferencePool={"endpointPickerRef": {
                   "name": "epp", "port": {"number": 9002}, "failureMode": "Retry"}})),
               ("picker port 0", service("bad", inferencePool={"endpointPickerRef": {"name": "epp", "port": {"number": 0}}}))]
    messages = {"shardsPerPod above shards": "shardsPerPod must not exceed shards",
                "shardsPerPod not dividing shards": "shardsPerPod must divide shards",
                "shardsPerPod 2 of the default 1 shard": "shardsPerPod must not exceed shards",
                "shardEnv sets RANK": "are set by the operator",
                "shardEnv turns NVLink multicast on": "NVLink multicast stays off",
                "quantize exl2": "spec.quantize",
                "quantize a number": "spec.quantize",
                "bad kvCacheDtype": "spec.kvCacheDtype",
                "HPA to zero": "minReplicas 0 (scale to zero) needs mode KEDA",
                "InferencePool without a picker": "an InferencePool needs endpointPickerRef",
                "picker Service without a port": "port is required when kind is 'Service'"}
    for what, obj in invalid:
        obj["spec"] = {k: v for k, v in obj["spec"].items() if v is not None}
        code, body = server.request("POST", TGS, obj)
        check(code == 422, f"invalid spec ({what}) refused with 422, got {code}: {str(body)[:200]}")
        if what in messages:
            check(messages[what] in json.dumps(body), f"{what}: the refusal says why: {str(body)[:400]}")
    code, body = server.request("POST", TGS, service("tp4", shards=4, shardsPerPod=2,
                                                     shardEnv=[{"name": "NCCL_IB_HCA", "value": "mlx5"}]))
    check(code == 201, f"shards 4 over pods of 2 with NCCL env accepted: {code} {str(body)[:300]}")
    server.request("DELETE", f"{TGS}/tp4")
    for q in crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
            "quantize"]["enum"]:
        code, body = server.request("POST", TGS, service("quant", quantize=q, kvCacheDtype="fp8_e4m3fn"))
        check(code == 201, f"quantize {q} with an fp8 KV cache accepted: {code} {str(body)[:300]}")
        server.request("DELETE", f"{TGS}/quant")
    code, body = server.request("POST", TGS, service("zero", autoscaling={
        "mode": "KEDA", "minReplicas": 0, "maxReplicas": 3, "prometheusAddress": "http://prometheus:9090"}))
    check(code == 201, f"KEDA with minReplicas 0 accepted: {code} {str(body)[:300]}")
    server.request("DELETE", f"{TGS}/zero")
    code, body = server.request("POST", TGS, service("defaults", shards=None, replicas=None))
    spec = (body or {}).get("spec", {})
    check(code == 201 and spec.get("shards") == 1 and spec.get("replicas") == 1,
          f"defaults applied by the schema: {code} {spec}")
    server.request("DELETE", f"{TGS}/defaults")


def test_objects(server, op):
    code, _ = server.request("POST", TGS, service("llama"))
    check(code == 201, f"create llama: {code}")
    uid = get(server, f"{TGS}/llama")["metadata"]["uid"]
    # Applied one after another: wait for the last kinds too.
    wait_for("every object", lambda: len(items(server, STS)) == 2 and "llama" in items(server, SVC) and
             items(server, HPA) and items(server, PDB))
    sts = items(server, STS)
    for r in (0, 1):
        s = sts.get(f"llama-shard-{r}", {})
        refs = s.get("metadata", {}).get("ownerReferences", [])
        check(len(refs) == 1 and refs[0]["uid"] == uid and refs[0]["controller"] is True and
              refs[0]["kind"] == "TextGenerationService", f"shard-{r} owner reference: {refs}")
        labels = s.get("metadata", {}).get("labels", {})
        check(labels.get("textgen.dev/service") == "llama" and labels.get("textgen.dev/replica") == str(r) and
              labels.get("app.kubernetes.io/managed-by") == "textgen-operator", f"shard-{r} labels: {labels}")
        spec = s.get("spec", {})
        check(spec.get("replicas") == 1 and spec.get("serviceName") == f"llama-shard-{r}" and
              spec.get("updateStrategy") == {"type": "OnDelete"},
              f"shard-{r}: one pod (both ranks) behind its headless Service, replaced by the operator: {spec}")
        pod = spec.get("template", {}).get("spec", {})
        containers = pod.get("containers", [])
        check([c.get("name") for c in containers] == ["shard"], "one container runs the pod's ranks")
        host = f"llama-shard-{r}-0.llama-shard-{r}.{NS}.svc.cluster.local"
        for c in containers:
            env = env_of(c)
            check("RANK" not in env and "WORLD_SIZE" not in env and "CUDA_VISIBLE_DEVICES" not in env and
                  env.get("MASTER_ADDR") == "127.0.0.1" and env.get("MASTER_PORT") == "29500" and
                  env.get("NCCL_NVLS_ENABLE") == "0", f"shard-{r}: rendezvous env (per-rank env is the launcher's) {env}")
            check(env.get("HF_TOKEN") == {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}} and
                  env.get("MODEL_ID") == "meta-llama/Llama-2-7b-hf", "model and token env")
            cmd = " ".join(c.get("command", []))
            check("exec textgen-launcher --model-id \"$model\" '--shards-only' '--num-shard' '2' '--world-size' '2' "
                  f"'--gpus-per-shard' '1' '--port' '50051' '--shard-urls' '{host}:50051,{host}:50052' "
                  "'--dtype' 'bfloat16' '--rank-offset' '0'" in cmd,
                  f"the launcher runs ranks 0 and 1 on ports 50051 and 50052, every rank's address, the dtype: {cmd}")
            check([p["containerPort"] for p in c.get("ports", [])] == [50051, 50052, 29500], f"ports: {c.get('ports')}")
            check(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") == "2",
                  "both ranks' GPUs in the one container")
            check(all(c.get(p, {}).get("tcpSocket", {}).get("port") == 50051
                      for p in ("readinessProbe", "livenessProbe", "startupProbe")), "probes on the pod's first rank")
        check(pod.get("nodeSelector") == {"gpu": "h100"} and pod.get("tolerations"), "scheduling fields")
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        check(vols.get("model", {}).get("persistentVolumeClaim", {}).get("claimName") == f"llama-model-cache-{r}",
              "each replica's pods share one model cache")
        check(vols.get("shm", {}).get("emptyDir") == {"medium": "Memory", "sizeLimit": "2Gi"},
              f"one memory-backed /dev/shm for the pod's ranks: {vols.get('shm')}")
    svcs = items(server, SVC)
    check({"llama", "llama-shards", "llama-shard-0", "llama-shard-1"} <= set(svcs), f"services: {list(svcs)}")
    disc = svcs.get("llama-shards", {}).get("spec", {})
    check(disc.get("clusterIP") == "None" and disc.get("selector", {}).get("apps.kubernetes.io/pod-index") == "0",
          "discovery Service over every replica's rank 0")
    router = get(server, f"{DEPLOY}/llama-router")
    rc = (router or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0]
    cmd = " ".join(rc.get("command", []))
    check(f"dns:llama-shards.{NS}.svc.cluster.local:50051" in cmd and "'--max-input-tokens' '1024'" in cmd and
          "'$(API_KEY)'" in cmd, f"router flags: {cmd}")
    check(env_of(rc).get("API_KEY") == {"secretKeyRef": {"name": "api", "key": "API_KEY"}}, "router API key env")
    hpa = get(server, f"{HPA}/llama")
    hs = (hpa or {}).get("spec", {})
    check(hs.get("scaleTargetRef", {}).get("kind") == "TextGenerationService" and hs.get("maxReplicas") == 4 and
          hs.get("metrics", [{}])[0].get("object", {}).get("metric", {}).get("name") == "tgi_queue_size" and
          hs["metrics"][0]["object"]["target"].get("averageValue") == "6", f"HPA on tgi_queue_size: {hs}")
    check("llama-shards" in items(server, PDB), "PodDisruptionBudget over the shard pods")
    check(set(items(server, PVC)) == {"llama-model-cache-0", "llama-model-cache-1"}, "model cache claims")
    tgs = get(server, f"{TGS}/llama")
    check("textgen.dev/cleanup" in tgs["metadata"].get("finalizers", []), "finalizer added")
    wait_for("status written", lambda: condition(get(server, f"{TGS}/llama"), "Ready").get("reason") == "ReplicasNotReady")
    st = get(server, f"{TGS}/llama")["status"]
    check(st.get("replicas") == 2 and st.get("readyReplicas") == 0 and st.get("observedGeneration") == 1 and
          st.get("selector") == "textgen.dev/service=llama,textgen.dev/component=shard" and
          st.get("endpoint") == f"http://llama.{NS}.svc.cluster.local", f"status: {st}")
    check(condition(get(server, f"{TGS}/llama"), "Progressing").get("status") == "True",
          "progressing while rolling out")

    # Readiness flows into the conditions.
    mark_ready(server, "llama", 2, 1)
    ready = wait_for("Ready=True", lambda: condition(get(server, f"{TGS}/llama"), "Ready").get("status") == "True")
    tgs = get(server, f"{TGS}/llama")
    check(ready and tgs["status"].get("readyReplicas") == 2 and
          condition(tgs, "Progressing").get("status") == "False" and
          condition(tgs, "Degraded").get("status") == "False", f"ready status: {tgs.get('status')}")

    # A settled service: another pass writes nothing. The reconcile counter counts passes as they
    # start, and one key is never reconciled by two passes at once: once a pass for a second touch has
    # started, the pass for the first has finished, and its writes are counted.
    before = op.metrics()

    def passes():
        return op.metrics().get("textgen_operator_reconciles_total", 0)
    server.merge(f"{TGS}/llama", {"metadata": {"annotations": {"touch": "1"}}})
    first = wait_for("a pass after the first touch", lambda: passes() > before.get("textgen_operator_reconciles_total", 0)
                     and passes())
    server.merge(f"{TGS}/llama", {"metadata": {"annotations": {"touch": "2"}}})
    wait_for("a pass after the second touch (so the first pass has finished)", lambda: passes() > (first or 0))
    after = op.metrics()
    check(after.get("textgen_operator_writes_total") == before.get("textgen_operator_writes_total"),
          f"a settled pass writes nothing ({before.get('textgen_operator_writes_total')} -> "
          f"{after.get('textgen_operator_writes_total')} writes)")
    check_events(server, op, uid)


def events_of(server, name):
    code, body = server.request("GET", EVENTS)
    return [e for e in (body or {}).get("items", []) if e.get("involvedObject", {}).get("name") == name] \
        if code == 200 else []


def check_events(server, op, uid):
    """The operator's Events about llama: one per child created, Ready once it was, each about the
    resource and by textgen-operator, valid core/v1 Events (kubernetes-models' schema)."""
    evs = events_of(server, "llama")
    created = [e for e in evs if e.get("reason") == "Created"]
    check(len(created) >= 9 and {e["message"].split(" ", 1)[1] for e in created} >=
          {"StatefulSet llama-shard-0", "StatefulSet llama-shard-1", "Deployment llama-router", "Service llama",
           "HorizontalPodAutoscaler llama", "PodDisruptionBudget llama-shards"},
          f"a Created event per child: {sorted(e.get('message', '') for e in created)}")
    check(all(e["type"] == "Normal" and e["involvedObject"].get("uid") == uid and
              e["involvedObject"].get("kind") == "TextGenerationService" and
              e["involvedObject"].get("apiVersion") == "textgen.dev/v1alpha1" and
              e.get("reportingComponent") == "textgen-operator" and
              e.get("source", {}).get("component") == "textgen-operator" and e.get("count") == 1 for e in created),
          f"events name the resource and the operator: {created[:1]}")
    ready = [e for e in evs if e.get("reason") == "Ready"]
    check(len(ready) == 1 and ready[0]["type"] == "Normal", f"one Ready event: {ready}")
    as_core = [dict(e, apiVersion="v1") for e in evs]
    r = subprocess.run(["node", os.path.join(TOOLS, "validate.mjs")], input=json.dumps(as_core),
                       capture_output=True, text=True, cwd=TOOLS)
    check(r.returncode == 0 and r.stdout.count("valid v1 Event") == len(evs),
          f"the events are valid core/v1 Events: {r.stdout[-800:]} {r.stderr[-300:]}")

    # A steady pass: no Event, and no GET or list of an owned kind (the informers serve them).
    def passes():
        return op.metrics().get("textgen_operator_reconciles_total", 0)
    counts = {e["metadata"]["name"]: e.get("count") for e in evs}
    before, requests = op.metrics(), server.request_counts()
    for touch in ("3", "4"):
        n = passes()
        server.merge(f"{TGS}/llama", {"metadata": {"annotations": {"touch": touch}}})
        wait_for(f"a pass after touch {touch}", lambda: passes() > n)
    after, requests_after = op.metrics(), server.request_counts()
    check(any(k[2] == "statefulsets" for k in requests),
          f"the API server counts requests by resource: {sorted(requests)[:10]}")
    reads = {k: requests_after[k] - requests.get(k, 0) for k in requests_after
             if k[0] in ("GET", "LIST") and (k[1], k[2]) in OWNED and requests_after[k] > requests.get(k, 0)}
    check(not reads, f"a steady pass reads no owned kind from the API server: {reads}")
    check(after.get("textgen_operator_events_total") == before.get("textgen_operator_events_total") and
          after.get("textgen_operator_events_aggregated_total") ==
          before.get("textgen_operator_events_aggregated_total"),
          f"a steady pass records no event ({before.get('textgen_operator_events_total')} -> "
          f"{after.get('textgen_operator_events_total')})")
    check({e["metadata"]["name"]: e.get("count") for e in events_of(server, "llama")} == counts,
          "no new or recounted Event after steady passes")


def test_scale_to_zero(server):
    """KEDA with minReplicas 0 (its CRD installed, so the server validates the ScaledObject): no
    shard StatefulSet at 0 replicas, the router and its Service stay (ready on the port alone),
    replica 0's model cache stays; KEDA's scale to 1 and back to 0 through /scale."""
    obj = service("idle", replicas=0, autoscaling={"mode": "KEDA", "minReplicas": 0, "maxReplicas": 2,
                                                   "prometheusAddress": "http://prometheus:9090"})
    code, body = server.request("POST", TGS, obj)
    check(code == 201, f"create idle: {code} {str(body)[:200]}")
    so = wait_for("the ScaledObject", lambda: get(server, f"{SCALED}/idle"))
    spec = (so or {}).get("spec", {})
    triggers = spec.get("triggers", [])
    check(spec.get("minReplicaCount") == 0 and spec.get("maxReplicaCount") == 2 and
          spec.get("scaleTargetRef", {}).get("kind") == "TextGenerationService" and len(triggers) == 2 and
          all(t["metadata"].get("activationThreshold") == "0" for t in triggers) and
          'tgi_queue_size{namespace="default",service="idle"}' in triggers[0]["metadata"]["query"] and
          'rate(tgi_request_count{namespace="default",service="idle"}[2m])' in triggers[1]["metadata"]["query"],
          f"a ScaledObject that scales to zero and wakes on the queue or incoming requests: {spec}")
    router = wait_for("idle's router", lambda: get(server, f"{DEPLOY}/idle-router"))
    probe = (router or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0] \
        .get("readinessProbe", {})
    check("tcpSocket" in probe and (router or {}).get("spec", {}).get("replicas") == 1,
          f"the router stays up with no replica (ready on its port, not /health): {probe}")
    check(wait_for("ScaledToZero", lambda: condition(get(server, f"{TGS}/idle"), "Ready").get("reason") ==
                   "ScaledToZero") is not None, "Ready=False ScaledToZero")
    check(condition(get(server, f"{TGS}/idle"), "Degraded").get("status") == "False",
          f"the ScaledObject was accepted: {condition(get(server, f'{TGS}/idle'), 'Degraded')}")
    check(not [n for n in items(server, STS) if n.startswith("idle-")] and "idle" in items(server, SVC) and
          "idle-model-cache-0" in items(server, PVC), "no shard at zero; the router Service and model cache stay")
    server.merge(f"{TGS}/idle/scale", {"spec": {"replicas": 1}})  # what KEDA does on activation
    check(wait_for("idle-shard-0", lambda: "idle-shard-0" in items(server, STS)) is not None,
          "scaled from zero: a replica")
    server.merge(f"{TGS}/idle/scale", {"spec": {"replicas": 0}})
    check(wait_for("idle-shard-0 gone", lambda: "idle-shard-0" not in items(server, STS)) is not None and
          get(server, f"{DEPLOY}/idle-router") is not None and "idle-model-cache-0" in items(server, PVC),
          "back to zero: the replica goes, the router and the model cache stay")
    server.request("DELETE", f"{TGS}/idle")
    wait_for("idle removed", lambda: get(server, f"{TGS}/idle") is None)


def test_inference_pool(server):
    """spec.inferencePool before the cluster serves InferencePools: Degraded CRDNotInstalled and one
    Warning event, nothing else held up; once the CRD is installed (the upstream v1 schema, so the
    server validates the pool), the pool appears over the router pods; turned off, it goes."""
    obj = service("pool", replicas=1, autoscaling=None,
                  inferencePool={"endpointPickerRef": {"name": "pool-epp", "port": {"number": 9002}}})
    obj["spec"] = {k: v for k, v in obj["spec"].items() if v is not None}
    code, body = server.request("POST", TGS, obj)
    check(code == 201, f"create pool: {code} {str(body)[:200]}")
    degraded = wait_for("Degraded CRDNotInstalled", lambda: condition(get(server, f"{TGS}/pool"), "Degraded")
                        .get("reason") == "CRDNotInstalled")
    msg = condition(get(server, f"{TGS}/pool"), "Degraded").get("message", "")
    check(degraded is not None and "InferencePool" in msg and "Gateway API Inference Extension" in msg,
          f"the missing CRD is named: {msg}")
    check(get(server, f"{DEPLOY}/pool-router") is not None and "pool-shard-0" in items(server, STS),
          "the other objects are made meanwhile")
    missing = [e for e in events_of(server, "pool") if e.get("reason") == "CRDNotInstalled"]
    check(len(missing) == 1 and missing[0]["type"] == "Warning", f"one CRDNotInstalled warning: {missing}")
    server.install_crd_file(os.path.join(CRDS, "inference.networking.k8s.io_inferencepools.yaml"))
    pool = wait_for("the InferencePool", lambda: get(server, f"{POOLS}/pool"), 30)
    spec = (pool or {}).get("spec", {})
    router = get(server, f"{DEPLOY}/pool-router") or {}
    labels = router.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})
    match = spec.get("selector", {}).get("matchLabels", {})
    check(match and all(labels.get(k) == v for k, v in match.items()) and
          spec.get("targetPorts") == [{"number": 3000}] and
          spec.get("endpointPickerRef") == {"name": "pool-epp", "kind": "Service", "group": "",
                                            "port": {"number": 9002}, "failureMode": "FailClose"},
          f"the pool: the router pods, their HTTP port, the picker (the CRD's defaults applied): {spec}")
    refs = (pool or {}).get("metadata", {}).get("ownerReferences", [])
    check(len(refs) == 1 and refs[0]["kind"] == "TextGenerationService" and refs[0]["name"] == "pool",
          f"owned by the resource: {refs}")
    check(wait_for("Degraded cleared", lambda: condition(get(server, f"{TGS}/pool"), "Degraded")
                   .get("status") == "False") is not None, "Degraded clears once the pool is made")
    code, body = server.request("POST", POOLS, {
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": {"name": "dup"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 1}, {"number": 1}]}})
    check(code == 422 and "port number must be unique" in json.dumps(body),
          f"the CRD's own rules hold (duplicate ports refused): {code}")
    server.merge(f"{TGS}/pool", {"spec": {"inferencePool": {"enabled": False}}})
    check(wait_for("the pool deleted", lambda: get(server, f"{POOLS}/pool") is None) is not None,
          "turned off, the pool is deleted")
    check(wait_for("a Deleted event", lambda: [e for e in events_of(server, "pool") if e.get("reason") == "Deleted"
                                                and "InferencePool pool" in e.get("message", "")]) is not None,
          "a Deleted event for the pool")
    server.request("DELETE", f"{TGS}/pool")
    wait_for("pool removed", lambda: get(server, f"{TGS}/pool") is None)


def test_scale_and_edit(server):
    code, body = server.merge(f"{TGS}/llama/scale", {"spec": {"replicas": 3}})
    check(code == 200, f"PATCH /scale: {code} {str(body)[:200]}")
    check(wait_for("replica 2", lambda: "llama-shard-2" in items(server, STS)) is not None, "scale up adds a replica")
    code, scale = server.request("GET", f"{TGS}/llama/scale")
    check(code == 200 and scale["spec"]["replicas"] == 3 and
          scale["status"].get("selector") == "textgen.dev/service=llama,textgen.dev/component=shard",
          f"scale subresource reads back: {scale}")
    server.merge(f"{TGS}/llama/scale", {"spec": {"replicas": 1}})
    gone = wait_for("replicas 1 and 2 removed", lambda: set(items(server, STS)) == {"llama-shard-0"} and
                    not {"llama-shard-1", "llama-shard-2"} & set(items(server, SVC)) and
                    set(items(server, PVC)) == {"llama-model-cache-0"})
    check(gone is not None, "scale down removes StatefulSets, Services, claims")
    # An edit rolls the StatefulSets.
    server.merge(f"{TGS}/llama", {"spec": {"dtype": "float16"}})
    rolled = wait_for("float16 template", lambda: "float16" in json.dumps(
        (get(server, f"{STS}/llama-shard-0") or {}).get("spec", {}).get("template", {})))
    check(rolled is not None, "spec edit reaches the pod template")
    server.merge(f"{TGS}/llama", {"spec": {"quantize": "bitsandbytes-nf4", "kvCacheDtype": "fp8_e5m2"}})
    rolled = wait_for("quantized template", lambda: "'--quantize' 'bitsandbytes-nf4' '--kv-cache-dtype' 'fp8_e5m2'"
                      in " ".join((get(server, f"{STS}/llama-shard-0") or {}).get("spec", {}).get("template", {})
                                  .get("spec", {}).get("containers", [{}])[0].get("command", [])))
    check(rolled is not None, "a quantize/kvCacheDtype edit reaches the launcher's flags in the pod template")
    check(wait_for("Progressing while rolling", lambda: condition(get(server, f"{TGS}/llama"), "Progressing")
                   .get("status") == "True") is not None, "Progressing=True after the edit")
    mark_ready(server, "llama", 1, 1)
    check(wait_for("Ready again", lambda: condition(get(server, f"{TGS}/llama"), "Ready").get("status") == "True")
          is not None, "Ready once the rollout is done")


def make_pod(server, tgs_name, r, ordinal, revision, ready=True, restarts=0):
    """Pod `ordinal` of replica r as the StatefulSet controller would make it (its template, the
    ordinal and revision labels) with the status the kubelet would report."""
    sts = get(server, f"{STS}/{tgs_name}-shard-{r}")
    tmpl = sts["spec"]["template"]
    name = f"{tgs_name}-shard-{r}-{ordinal}"
    labels = dict(tmpl["metadata"]["labels"], **{"apps.kubernetes.io/pod-index": str(ordinal),
                                                   "controller-revision-hash": revision})
    code, body = server.request("POST", POD, {"apiVersion": "core.textgen.test/v1", "kind": "Pod",
                                              "metadata": {"name": name, "labels": labels}, "spec": tmpl["spec"]})
    check(code == 201, f"create pod {name}: {code} {str(body)[:200]}")
    set_pod_status(server, name, tmpl, ready, restarts)


def set_pod_status(server, name, tmpl, ready=True, restarts=0):
    server.merge(f"{POD}/{name}/status", {"status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [{"name": c["name"], "ready": ready, "restartCount": restarts if i == 0 else 0}
                              for i, c in enumerate(tmpl["spec"]["containers"])]}})


def settle(server, op, tgs_name):
    """Returns once a reconcile pass has started after this call (and so every earlier one of the
    key has finished: one key is never reconciled twice at once)."""
    def passes():
        return op.metrics().get("textgen_operator_reconciles_total", 0)
    before = passes()
    server.merge(f"{TGS}/{tgs_name}", {"metadata": {"annotations": {"touch": str(time.time())}}})
    wait_for("a reconcile pass", lambda: passes() > before)


def test_group_restart(server, op):
    obj = service("tp", model={"id": "llama", "pvc": {"claimName": "fixtures"}}, shards=2, shardsPerPod=1,
                  replicas=2, dtype=None, autoscaling=None, router={"maxInputTokens": 8, "maxTotalTokens": 16},
                  shardEnv=[{"name": "NCCL_SOCKET_IFNAME", "value": "ib0"}, {"name": "NCCL_IB_HCA", "value": "mlx5"}])
    obj["spec"] = {k: v for k, v in obj["spec"].items() if v is not None}
    # Replica 1's StatefulSet as an older operator left it, with the API server's default rollingUpdate
    # (which OnDelete refuses and server-side apply would keep).
    code, _ = server.request("POST", STS, {
        "apiVersion": "apps.textgen.test/v1", "kind": "StatefulSet",
        "metadata": {"name": "tp-shard-1", "labels": {"textgen.dev/service": "tp",
                                                      "app.kubernetes.io/managed-by": "textgen-operator"}},
        "spec": {"replicas": 2, "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}}})
    check(code == 201, f"create an old-style StatefulSet: {code}")
    code, body = server.request("POST", TGS, obj)
    check(code == 201, f"create tp: {code} {str(body)[:200]}")
    if not wait_for("tp's StatefulSets", lambda: {"tp-shard-0", "tp-shard-1"} <= set(items(server, STS)) and
                    (get(server, f"{STS}/tp-shard-1") or {}).get("spec", {}).get("template")):
        return
    check(get(server, f"{STS}/tp-shard-1")["spec"]["updateStrategy"] == {"type": "OnDelete"},
          f"an old StatefulSet is switched to OnDelete: {get(server, f'{STS}/tp-shard-1')['spec']['updateStrategy']}")
    # One rank per pod: two pods per replica, RANK from the ordinal, rendezvous at pod 0.
    sts = get(server, f"{STS}/tp-shard-0")
    check(sts["spec"]["replicas"] == 2, f"two pods per replica: {sts['spec']['replicas']}")
    c = sts["spec"]["template"]["spec"]["containers"]
    env = env_of(c[0]) if len(c) == 1 else {}
    host = f"tp-shard-0-{{}}.tp-shard-0.{NS}.svc.cluster.local"
    check(len(c) == 1 and env.get("POD_INDEX") == {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}
          and "RANK" not in env and env.get("MASTER_ADDR") == host.format(0) and env.get("NCCL_NVLS_ENABLE") == "0"
          and env.get("NCCL_SOCKET_IFNAME") == "ib0" and env.get("NCCL_IB_HCA") == "mlx5",
          f"one container, POD_INDEX from the ordinal, pod 0 as MASTER_ADDR, NCCL env passed through: {env}")
    line = c[0]["command"][-1] if c else ""
    check(line.startswith("exec textgen-launcher --model-id '/data/llama' '--shards-only' '--num-shard' '1' "
                          "'--world-size' '2'") and line.endswith(" --rank-offset $((POD_INDEX * 1))") and
          f"'--shard-urls' '{host.format(0)}:50051,{host.format(1)}:50051'" in line,
          f"the first rank computed from POD_INDEX, shard urls: {line}")

    for r in (0, 1):
        for p in (0, 1):
            make_pod(server, "tp", r, p, "rev-1")
    mark_ready(server, "tp", 2, 2, "rev-1")
    settle(server, op, "tp")
    check(set(items(server, POD)) >= {"tp-shard-0-0", "tp-shard-0-1", "tp-shard-1-0", "tp-shard-1-1"},
          "serving replicas are left alone")
    restarts = op.metrics().get("textgen_operator_group_restarts_total", 0)

    # Rank 1 of replica 0 restarts (its container exited): both pods of replica 0 go, replica 1 stays.
    tmpl = get(server, f"{STS}/tp-shard-0")["spec"]["template"]
    set_pod_status(server, "tp-shard-0-1", tmpl, ready=False, restarts=1)
    gone = wait_for("replica 0's pods deleted",
                    lambda: not {"tp-shard-0-0", "tp-shard-0-1"} & set(items(server, POD)))
    check(gone is not None, "a restarted rank takes every pod of its replica down")
    settle(server, op, "tp")
    check({"tp-shard-1-0", "tp-shard-1-1"} <= set(items(server, POD)), "the other replica keeps serving")
    check(op.metrics().get("textgen_operator_group_restarts_total", 0) == restarts + 1, "one group restart counted")

    # A template change: the StatefulSets move to rev-2; one whole replica at a time is replaced.
    for p in (0, 1):
        make_pod(server, "tp", 0, p, "rev-1")
    mark_ready(server, "tp", 2, 2, "rev-2")
    first = wait_for("one replica replaced", lambda: [r for r in (0, 1) if not {f"tp-shard-{r}-0", f"tp-shard-{r}-1"}
                                                      & set(items(server, POD))])
    settle(server, op, "tp")
    pods = set(items(server, POD))
    check(first == [0] and {"tp-shard-1-0", "tp-shard-1-1"} <= pods,
          f"replica 0 is replaced while replica 1 serves: {sorted(pods)}")
    for p in (0, 1):
        make_pod(server, "tp", 0, p, "rev-2", ready=False)
    settle(server, op, "tp")
    check({"tp-shard-1-0", "tp-shard-1-1"} <= set(items(server, POD)), "replica 1 waits while replica 0 loads")
    for p in (0, 1):
        set_pod_status(server, f"tp-shard-0-{p}", tmpl)
    check(wait_for("replica 1 replaced", lambda: not {"tp-shard-1-0", "tp-shard-1-1"} & set(items(server, POD)))
          is not None, "replica 1 is replaced once replica 0 serves again")
    check({"tp-shard-0-0", "tp-shard-0-1"} <= set(items(server, POD)), "replica 0 is left alone")
    server.request("DELETE", f"{TGS}/tp")
    wait_for("tp removed", lambda: get(server, f"{TGS}/tp") is None)
    for name in items(server, POD):  # no garbage collector here
        server.request("DELETE", f"{POD}/{name}")


def open_watches(server):
    """Watches of the operator's kinds the API server is serving (its apiserver_longrunning_requests
    gauge; the server's own watch of CRDs is not one of them)."""
    code, text = server.request("GET", "/metrics")
    if code != 200 or not isinstance(text, str):
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("apiserver_longrunning_requests{") and 'verb="WATCH"' in line and
               re.search(r'group="[^"]*textgen\.(dev|test)"', line))


def test_expired_watch(server, op):
    before = op.metrics().get("textgen_operator_relists_total", 0)
    op.proc.send_signal(signal.SIGSTOP)
    try:
        # Changes the stopped operator's watches will have to catch up with, then history gone.
        server.merge(f"{TGS}/llama", {"spec": {"replicas": 2}})
        for i in range(5):
            server.apply(f"{SVC}/filler-{i}", {"apiVersion": "core.textgen.test/v1", "kind": "Service",
                                               "metadata": {"name": f"filler-{i}"}, "spec": {"i": i}})
        # The API server ends the stopped operator's watches at their 3 s timeout; once none is
        # open, each must resume from a resourceVersion the compaction below removes.
        ended = wait_for("the API server to end the stopped operator's watches",
                         lambda: open_watches(server) == 0, 30)
        check(ended is not None, f"the watches end at their timeout ({open_watches(server)} still open)")
        server.etcd_compact()
    finally:
        op.proc.send_signal(signal.SIGCONT)
    relisted = wait_for("a relist", lambda: op.metrics().get("textgen_operator_relists_total", 0) > before, 40)
    check(relisted is not None, "an expired watch is recovered by relisting")
    check(wait_for("replica 1 back", lambda: "llama-shard-1" in items(server, STS), 30) is not None,
          "the change made meanwhile is reconciled")


def test_leader_election(server, op, standby):
    check(op.leading() and not standby.leading(), "only one operator leads")
    holder = (get(server, LEASE) or {}).get("spec", {}).get("holderIdentity", "")
    check(holder.endswith("_" + str(op.proc.pid)), f"the Lease names the leader: {holder}")
    standby_writes = standby.metrics().get("textgen_operator_writes_total", 0)
    server.merge(f"{TGS}/llama", {"spec": {"replicas": 1}})
    wait_for("scale to 1", lambda: set(items(server, STS)) == {"llama-shard-0"})
    check(standby.metrics().get("textgen_operator_writes_total", 0) == standby_writes == 0,
          "the standby writes nothing")
    op.stop(signal.SIGKILL)  # no release: the standby must wait the lease out
    took = wait_for("the standby to take over", standby.leading, 30)
    check(took is not None, "the standby takes over when the leader dies")
    server.merge(f"{TGS}/llama", {"spec": {"replicas": 2}})
    check(wait_for("replica 1 by the new leader", lambda: "llama-shard-1" in items(server, STS)) is not None,
          "the new leader reconciles")


def test_delete(server):
    code, _ = server.request("DELETE", f"{TGS}/llama")
    check(code in (200, 202), f"delete: {code}")
    gone = wait_for("cleanup", lambda: get(server, f"{TGS}/llama") is None and not items(server, STS) and
                    not {k for k in items(server, SVC) if k.startswith("llama")} and not items(server, DEPLOY) and
                    not items(server, HPA) and not items(server, PDB) and not items(server, PVC))
    check(gone is not None, "deleting the resource removes every object it owned")


def free_ports(n):
    """n consecutive free local ports (a run of container ports, e.g. a pod's ranks' gRPC ports,
    which the launcher numbers from its --port). Drawn below the kernel's ephemeral range: a port the
    kernel hands out for outgoing connections (other tests', gRPC clients') can be taken between this
    check and the shard's bind (a CI run lost demo-tp4 to "Address already in use" on one)."""
    import random
    lo, _ = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    low = max(1024, lo - 12000)
    while True:
        base = random.randrange(low, lo - n)
        if all(port_free(base + i) for i in range(n)):
            return base


def port_free(port):
    import socket
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class LocalCluster:
    """Pods of the operator's StatefulSets and Deployments as local processes: every container of a
    pod is a process, and the pod's ports (its containers share one network namespace) are local
    ports; consecutive container ports stay consecutive."""

    def __init__(self, server, volume_dirs):
        self.server, self.volumes, self.pods = server, volume_dirs, []
        self.ports_of = {}  # pod name -> container port -> local port, assigned before any starts

    @staticmethod
    def container_ports(template):
        return [p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])]

    @classmethod
    def local_ports(cls, template):
        ports, out = sorted(cls.container_ports(template)), {}
        i = 0
        while i < len(ports):
            j = i
            while j + 1 < len(ports) and ports[j + 1] == ports[j] + 1:
                j += 1
            base = free_ports(j - i + 1)
            out.update({ports[k]: base + k - i for k in range(i, j + 1)})
            i = j + 1
        return out

    def reserve(self, name, template):
        self.ports_of[name] = self.local_ports(template)

    def resolve(self, host):
        """A Service's DNS name -> its selected pods' local addresses (one port per name)."""
        name = host.split(".")[0]
        svc = get(self.server, f"{SVC}/{name}")
        selector = (svc or {}).get("spec", {}).get("selector", {})
        return [p for p in self.pods if selector and all(p["labels"].get(k) == v for k, v in selector.items())]

    def start_pod(self, name, template, labels, binaries):
        port_map = self.ports_of.get(name) or self.local_ports(template)
        pod = {"name": name, "labels": labels, "ports": port_map, "containers": []}
        for c in template["spec"]["containers"]:
            pod["containers"].append(self.start_container(c, labels, port_map, binaries))
        self.pods.append(pod)
        return pod

    def start_container(self, c, labels, port_map, binaries):
        env = dict(os.environ)
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
            elif "fieldRef" in e.get("valueFrom", {}):
                path = e["valueFrom"]["fieldRef"]["fieldPath"]
                key = path[len("metadata.labels['"):-2]
                env[e["name"]] = labels[key]
            elif "secretKeyRef" in e.get("valueFrom", {}):
                env[e["name"]] = "secret-" + e["valueFrom"]["secretKeyRef"]["name"]
        if "MASTER_PORT" in env:  # the rendezvous: this pod's port, or pod 0's through its DNS name
            master = self.ports_of.get(env.get("MASTER_ADDR", "").split(".")[0], port_map)
            env["MASTER_PORT"] = str(master.get(int(env["MASTER_PORT"]), env["MASTER_PORT"]))
            if ".svc.cluster.local" in env.get("MASTER_ADDR", ""):
                env["MASTER_ADDR"] = "127.0.0.1"
        mounts = {m["mountPath"]: self.volumes[m["name"]] for m in c.get("volumeMounts", [])
                  if m["name"] in self.volumes}
        if c["command"][:2] == ["/bin/sh", "-c"]:  # a shell line: the same mappings inside it
            line = c["command"][2]
            for path, local in mounts.items():
                line = line.replace(f"'{path}/", f"'{local}/")
            for name, binary in binaries.items():
                line = line.replace(f"exec {name} ", f"exec {binary} ")
            line = re.sub(r"'--port' '(\d+)'", lambda m: f"'--port' '{port_map.get(int(m[1]), m[1])}'", line)
            line = re.sub(r"[\w.-]+\.svc\.cluster\.local:\d+", lambda m: self.pod_address(m[0]), line)
            argv = ["/bin/sh", "-c", line]
        else:
            argv = [self.map_arg(c["command"], i, env, mounts, port_map, binaries)
                    for i in range(len(c["command"]))]
        log = open(os.path.join(self.server.dir, f"pod-{len(self.pods)}-{c['name']}.log"), "w+")
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        return {"name": c["name"], "proc": proc, "log": log, "argv": argv}

    def map_arg(self, command, i, env, mounts, port_map, binaries):
        a = command[i].replace("$(API_KEY)", env.get("API_KEY", ""))
        for path, local in mounts.items():
            if a.startswith(path + "/"):
                a = local + a[len(path):]
        if i > 0 and command[i - 1] == "--port" and int(a) in port_map:
            a = str(port_map[int(a)])
        if a.startswith("dns:"):
            host, port = a[4:].rsplit(":", 1)
            a = "static:" + ",".join(f"127.0.0.1:{p['ports'][int(port)]}" for p in self.resolve(host))
        elif ".svc.cluster.local:" in a:  # pod DNS names (<pod>.<service>.<ns>.svc...:port)
            a = ",".join(self.pod_address(addr) for addr in a.split(","))
        return binaries.get(a, a)

    def pod_address(self, addr):
        host, port = addr.rsplit(":", 1)
        pod = self.ports_of.get(host.split(".")[0])
        return f"127.0.0.1:{pod[int(port)]}" if pod else addr

    def processes(self):
        return [c for p in self.pods for c in p["containers"]]

    def stop(self):
        for c in self.processes():
            if c["proc"].poll() is None:
                c["proc"].terminate()
        for c in self.processes():
            try:
                c["proc"].wait(10)
            except subprocess.TimeoutExpired:
                c["proc"].kill()


def listening(port):
    import socket
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def end_to_end(server, name, shards, replicas, shards_per_pod=None):
    """The operator's objects for `name` (a fixture model on a volume, CPU ranks) run as local
    processes, and a generation through the router equals transformers' greedy tokens."""
    import http.client
    ref = json.load(open(os.path.join(MODELS, "llama-gqa", "reference.json")))["prompts"][0]
    obj = service(name, model={"id": "llama-gqa", "pvc": {"claimName": "fixtures"}}, shards=shards,
                  shardsPerPod=shards_per_pod, replicas=replicas, gpusPerShard=0, dtype=None, autoscaling=None, nodeSelector=None,
                  tolerations=None, router={"maxInputTokens": 64, "maxTotalTokens": 128})
    obj["spec"] = {k: v for k, v in obj["spec"].items() if v is not None}
    code, body = server.request("POST", TGS, obj)
    check(code == 201, f"create {name}: {code} {str(body)[:200]}")
    wanted = {f"{name}-shard-{r}" for r in range(replicas)}
    if not wait_for(f"{name} objects", lambda: wanted <= set(items(server, STS)) and
                    get(server, f"{DEPLOY}/{name}-router") and f"{name}-shards" in items(server, SVC)):
        return
    cluster = LocalCluster(server, {"model": MODELS})
    # The shard pods' launcher runs the textgen-shard beside it (the build directory's).
    binaries = {"textgen-launcher": LAUNCHER, "textgen-router": ROUTER}
    try:
        shards_, pods = [], []
        for r in range(replicas):
            sts = get(server, f"{STS}/{name}-shard-{r}")
            for ordinal in range(sts["spec"]["replicas"]):
                labels = dict(sts["spec"]["template"]["metadata"]["labels"])
                labels["apps.kubernetes.io/pod-index"] = str(ordinal)
                pod = f"{name}-shard-{r}-{ordinal}"
                cluster.reserve(pod, sts["spec"]["template"])
                pods.append((pod, sts["spec"]["template"], labels))
        for pod, template, labels in pods:
            shards_.append(cluster.start_pod(pod, template, labels, binaries))
        ranks = [(p, port) for p in shards_ for port in p["ports"] if port != 29500]
        check(len(ranks) == shards * replicas and all(len(p["containers"]) == 1 for p in shards_),
              f"{name}: {shards * replicas} ranks in {len(shards_)} pods of one container")
        up = wait_for(f"{name}'s ranks listening", lambda: all(listening(p["ports"][port]) for p, port in ranks), 90)
        check(up is not None, f"{name}: the StatefulSets' shard commands serve: " +
              "; ".join(" ".join(c["argv"]) for c in cluster.processes()))
        deploy = get(server, f"{DEPLOY}/{name}-router")
        tmpl = deploy["spec"]["template"]
        router = cluster.start_pod(f"{name}-router-0", tmpl, dict(tmpl["metadata"]["labels"]), binaries)
        port = router["ports"][3000]
        argv = " ".join(router["containers"][0]["argv"])
        check("static:127.0.0.1:" in argv and argv.count("127.0.0.1:") == replicas,
              f"{name}: the discovery Service resolves to every replica's rank 0: {argv}")

        def health():
            if not listening(port):
                return False
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        check(wait_for(f"{name}'s router healthy", health, 60) is not None, f"{name}: the router Deployment's command serves")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/generate", json.dumps({"inputs": ref["text"], "parameters": {
            "max_new_tokens": 8, "details": True, "decoder_input_details": False}}),
            {"Content-Type": "application/json"})
        resp = conn.getresponse()
        out = json.loads(resp.read() or b"{}")
        ids = [t["id"] for t in out.get("details", {}).get("tokens", [])]
        check(resp.status == 200 and ids == ref["greedy"][:8],
              f"{name}: a generation through the operator's pods equals transformers: {resp.status} {ids} vs "
              f"{ref['greedy'][:8]}")
    finally:
        cluster.stop()
        if results["failed"]:
            for c in cluster.processes():
                c["log"].seek(0)
                print(f"--- {' '.join(c['argv'])}\n" + c["log"].read()[-1500:])
    server.request("DELETE", f"{TGS}/{name}")


def test_end_to_end(server):
    end_to_end(server, "demo", shards=1, replicas=2)
    # Tensor parallelism, each shard pod one container running textgen-launcher --shards-only: one pod
    # of two ranks (over Gloo, rendezvous on 127.0.0.1), two pods of one rank and four ranks as two pods
    # of two (the first rank from POD_INDEX, rendezvous at pod 0).
    end_to_end(server, "demo-tp", shards=2, replicas=1)
    end_to_end(server, "demo-tp-pods", shards=2, replicas=1, shards_per_pod=1)
    end_to_end(server, "demo-tp4", shards=4, replicas=1, shards_per_pod=2)


def main():
    server = KubeTestServer().start()
    ops = []
    try:
        server.install_lookalikes()
        server.install_crd_file(os.path.join(CRDS, "keda.sh_scaledobjects.yaml"))
        test_crd(server)
        op = Operator(server, "operator-1")
        ops.append(op)
        wait_for("leadership", op.leading)
        test_objects(server, op)
        test_scale_and_edit(server)
        test_scale_to_zero(server)
        test_inference_pool(server)
        test_group_restart(server, op)
        test_expired_watch(server, op)
        standby = Operator(server, "operator-2")
        ops.append(standby)
        wait_for("standby up", lambda: standby.metrics() != {})
        test_leader_election(server, op, standby)
        test_end_to_end(server)
        test_delete(server)
        code = standby.stop()
        check(code == 0, f"SIGTERM: exit 0 (got {code})")
        check("released lease" in standby.output(), "the lease is released on shutdown")
    finally:
        for o in ops:
            o.stop(signal.SIGKILL)
        if results["failed"]:
            for o in ops:
                print(f"--- {o.log.name}\n" + o.output()[-3000:])
            print(server.logs(15))
        server.stop()
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
