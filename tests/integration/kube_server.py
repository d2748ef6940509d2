"""A real Kubernetes API server for custom resources, for the operator's tests.

etcd (Debian's etcd-server) and apiextensions-apiserver (built from Debian's Go sources by
tools/k8s-test-server/build.sh, cached) on free ports, with a generated CA, a serving certificate
for 127.0.0.1 and a client certificate in system:masters, and a kubeconfig for them. It serves
CRDs only: built-in kinds are installed as look-alike CRDs under <group>.textgen.test (the operator's
--test-api-groups). The watch cache is off, so an etcd compaction expires old resourceVersions
exactly as it does behind a real cluster's cache once its window has passed.
"""
import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, **kw):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)


class KubeTestServer:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="textgen-kube-")
        self.procs = []

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self):
        binary = subprocess.run(["bash", os.path.join(REPO, "tools/k8s-test-server/build.sh")],
                                check=True, capture_output=True, text=True).stdout.strip()
        self._certs()
        self.etcd_port, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self.procs.append(subprocess.Popen(
            ["etcd", "--data-dir", os.path.join(self.dir, "etcd"), "--listen-client-urls", self.etcd_url,
             "--advertise-client-urls", self.etcd_url, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"default=http://127.0.0.1:{peer}"],
            stdout=open(os.path.join(self.dir, "etcd.log"), "w"), stderr=subprocess.STDOUT))
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self._kubeconfig()
        kc = self.kubeconfig
        self.procs.append(subprocess.Popen(
            [binary, "--etcd-servers", self.etcd_url, "--secure-port", str(self.port),
             "--bind-address", "127.0.0.1", "--tls-cert-file", self.path("server.crt"),
             "--tls-private-key-file", self.path("server.key"), "--client-ca-file", self.path("ca.crt"),
             "--authentication-skip-lookup", "--kubeconfig", kc, "--authentication-kubeconfig", kc,
             "--authorization-kubeconfig", kc, "--enable-priority-and-fairness=false",
             "--watch-cache=false",
             "--disable-admission-plugins",
             "NamespaceLifecycle,MutatingAdmissionPolicy,MutatingAdmissionWebhook,"
             "ValidatingAdmissionPolicy,ValidatingAdmissionWebhook"],
            stdout=open(os.path.join(self.dir, "apiserver.log"), "w"), stderr=subprocess.STDOUT))
        self._ssl = ssl.create_default_context(cafile=self.path("ca.crt"))
        self._ssl.load_cert_chain(self.path("client.crt"), self.path("client.key"))
        deadline = time.time() + 90
        while time.time() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError("kube test server exited:\n" + self.logs())
            try:
                # /readyz never passes: its informer-sync check waits for core Services, which
                # this server does not serve. Liveness and the CRD API are what the tests need.
                if (self.request("GET", "/healthz")[0] == 200 and
                        self.request("GET", "/apis/apiextensions.k8s.io/v1")[0] == 200):
                    return self
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError("kube test server not ready in 90 s:\n" + self.logs())

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self, lines=30):
        out = []
        for name in ("etcd.log", "apiserver.log"):
            try:
                out.append(f"--- {name}\n" + "".join(open(self.path(name)).readlines()[-lines:]))
            except OSError:
                pass
        return "\n".join(out)

    def path(self, name):
        return os.path.join(self.dir, name)

    # -- certificates and kubeconfig ---------------------------------------------------------------
    def _certs(self):
        p = self.path
        run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=textgen-test-ca", "-keyout", p("ca.key"), "-out", p("ca.crt")])
        with open(p("server.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for name, subj, ext in (("server", "/CN=127.0.0.1", ["-extfile", p("server.ext")]),
                                ("client", "/O=system:masters/CN=textgen-test-admin", [])):
            run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", subj, "-keyout",
                 p(name + ".key"), "-out", p(name + ".csr")])
            run(["openssl", "x509", "-req", "-in", p(name + ".csr"), "-CA", p("ca.crt"), "-CAkey",
                 p("ca.key"), "-CAcreateserial", "-days", "2", "-out", p(name + ".crt")] + ext)

    def _kubeconfig(self):
        def b64(name):
            return base64.b64encode(open(self.path(name), "rb").read()).decode()
        self.kubeconfig = self.path("kubeconfig")
        # JSON is YAML: the operator reads it with yaml-cpp, the server with client-go.
        json.dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.server,
                                                      "certificate-authority-data": b64("ca.crt")}}],
            "users": [{"name": "admin", "user": {"client-certificate-data": b64("client.crt"),
                                                 "client-key-data": b64("client.key")}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin",
                                                      "namespace": "default"}}],
        }, open(self.kubeconfig, "w"))

    # -- API ---------------------------------------------------------------------------------------
    def request(self, method, path, body=None, content_type="application/json"):
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=30) as r:
                raw = r.read()
                code = r.status
        except urllib.error.HTTPError as e:
            raw, code = e.read(), e.code
        try:
            return code, json.loads(raw) if raw else None
        except ValueError:
            return code, raw.decode(errors="replace")

    def apply(self, path, obj, manager="test"):
        return self.request("PATCH", f"{path}?fieldManager={manager}&force=true", obj,
                            "application/apply-patch+yaml")

    def merge(self, path, patch):
        return self.request("PATCH", path, patch, "application/merge-patch+json")

    def install_crd(self, crd):
        code, body = self.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        if code not in (200, 201, 409):
            raise RuntimeError(f"CRD {crd['metadata']['name']}: {code} {body}")
        name = crd["metadata"]["name"]
        deadline = time.time() + 30
        while time.time() < deadline:
            _, got = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conds = {c["type"]: c["status"] for c in ((got or {}).get("status") or {}).get("conditions") or []}
            if conds.get("Established") == "True":
                # Discovery of the new group can trail the condition a little.
                group, version = crd["spec"]["group"], crd["spec"]["versions"][0]["name"]
                if self.request("GET", f"/apis/{group}/{version}")[0] == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"CRD {name} not established")

    def install_crd_file(self, path):
        """A CRD from a YAML file (e.g. tests/k8s-crds/: KEDA's ScaledObject, the InferencePool)."""
        import yaml
        self.install_crd(yaml.safe_load(open(path)))

    def request_counts(self):
        """apiserver_request_total by (verb, group, resource), from the server's /metrics."""
        code, text = self.request("GET", "/metrics")
        counts = {}
        if code != 200 or not isinstance(text, str):
            return counts
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.rindex("}")].split(",")
                          if "=" in kv)
            key = tuple(labels.get(k, '""').strip('"') for k in ("verb", "group", "resource"))
            counts[key] = counts.get(key, 0) + float(line.rsplit(" ", 1)[1])
        return counts

    def install_lookalikes(self):
        """Built-in kinds as schemaless CRDs with a status subresource (the operator's
        --test-api-groups), and Lease at its real path."""
        kinds = [("core.textgen.test", "v1", "Service", "services"),
                 ("core.textgen.test", "v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
                 ("core.textgen.test", "v1", "Pod", "pods"),
                 ("apps.textgen.test", "v1", "StatefulSet", "statefulsets"),
                 ("apps.textgen.test", "v1", "Deployment", "deployments"),
                 ("autoscaling.textgen.test", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
                 ("policy.textgen.test", "v1", "PodDisruptionBudget", "poddisruptionbudgets"),
                 ("core.textgen.test", "v1", "Event", "events"),
                 ("coordination.k8s.io", "v1", "Lease", "leases")]
        for group, version, kind, plural in kinds:
            meta = {"name": f"{plural}.{group}"}
            if group.endswith(".k8s.io"):
                meta["annotations"] = {"api-approved.kubernetes.io": "unapproved, textgen tests only"}
            self.install_crd({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": meta,
                "spec": {"group": group, "scope": "Namespaced",
                         "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                                   "listKind": kind + "List"},
                         "versions": [{"name": version, "served": True, "storage": True,
                                       "subresources": {"status": {}},
                                       "schema": {"openAPIV3Schema": {
                                           "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}})

    def etcd_compact(self):
        """Compacts etcd at its current revision: every older resourceVersion is gone."""
        def post(path, body):
            req = urllib.request.Request(self.etcd_url + path, data=json.dumps(body).encode(), method="POST")
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read())
        rev = int(post("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
        post("/v3/kv/compaction", {"revision": rev, "physical": True})
        return rev
