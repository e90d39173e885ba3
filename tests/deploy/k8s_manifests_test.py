"""The Kubernetes manifests in deploy/k8s, built as kustomize builds them (the
base, and the 4x Spark overlays with each worker variant): every file is
used, every container's command line (its arguments with the pod's
variables filled in and its flagfile taken from the ConfigMap it mounts)
passes the daemon's --check_config, probes and ports are the daemons', every
ConfigMap, key and claim referenced exists, the grace period covers preStop
and the drain deadline, and each worker requests one GPU.
"""

import glob
import os
import re
import shutil
import subprocess
import unittest

import yaml

import deploy_lib as lib

K8S = lib.path("deploy", "k8s")
BUILDS = {
    "base": os.path.join(K8S, "base"),
    "spark-4x": os.path.join(K8S, "overlays", "spark-4x"),
    "spark-4x-statefulset": os.path.join(K8S, "overlays",
                                         "spark-4x-statefulset"),
}
SPARK_CONFIG = lib.path("deploy", "config", "spark-4x")

# What the pods' variables stand for in the checks (addresses of a node).
POD_IP = "10.1.0.11"
HOST_IP = "10.1.0.11"
# Variables the LeaderWorkerSet controller puts into its pods.
LWS_VARIABLES = ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")

_BUILT = {}


def build(name):
    if name not in _BUILT:
        _BUILT[name] = lib.Kustomize().build(BUILDS[name])
    return _BUILT[name]


def find(resources, kind, name):
    for r in resources:
        if r["kind"] == kind and r["metadata"]["name"] == name:
            return r
    return None


class Container:
    """One daemon container of a build, with its command line resolved."""

    def __init__(self, build_name, resources, workload, template_label,
                 template, spec):
        self.build = build_name
        self.resources = resources
        self.workload = workload
        self.where = "%s: %s %s/%s" % (build_name, template_label,
                                       workload["metadata"]["name"],
                                       spec["name"])
        self.template_label = template_label
        self.template = template
        self.pod = template["spec"]
        self.spec = spec
        self.daemon = os.path.basename(spec["command"][0])

    def variables(self):
        """The container's variables as a node would see them."""
        values = {}
        if self.workload["kind"] == "LeaderWorkerSet":
            name = self.workload["metadata"]["name"]
            size = self.workload["spec"]["leaderWorkerTemplate"]["size"]
            leader = "leader" in self.template_label
            values.update({
                "LWS_LEADER_ADDRESS": "%s-0.%s.mneme" % (name, name),
                "LWS_GROUP_SIZE": str(size),
                "LWS_WORKER_INDEX": "0" if leader else "1",
            })
        labels = {
            "leaderworkerset.sigs.k8s.io/name":
                self.workload["metadata"]["name"],
            "apps.kubernetes.io/pod-index": "1",
        }
        pod_names = {
            "LeaderWorkerSet leader": "%s-0",
            "LeaderWorkerSet worker": "%s-0-1",
            "StatefulSet": "%s-1",
            "Deployment": "%s-5d9c7b6f4-x2x7q",
            "DaemonSet": "%s-k2m4p",
        }
        pod_name = pod_names[self.template_label] % (
            self.workload["metadata"]["name"])
        for e in self.spec.get("env", []):
            if "value" in e:
                values[e["name"]] = e["value"]
                continue
            field = e["valueFrom"]["fieldRef"]["fieldPath"]
            if field == "status.podIP":
                values[e["name"]] = POD_IP
            elif field == "status.hostIP":
                values[e["name"]] = HOST_IP
            elif field == "metadata.name":
                values[e["name"]] = pod_name
            else:
                m = re.fullmatch(r"metadata\.labels\['([^']+)'\]", field)
                if not m or m.group(1) not in labels:
                    raise AssertionError("%s: unknown field %s" %
                                         (self.where, field))
                values[e["name"]] = labels[m.group(1)]
        return values

    def args(self):
        """The arguments with $(VAR) replaced; an unknown one fails."""
        values = self.variables()

        def sub(m):
            if m.group(1) not in values:
                raise AssertionError("%s: $(%s) is not defined" %
                                     (self.where, m.group(1)))
            return values[m.group(1)]

        return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, a)
                for a in self.spec.get("args", [])]

    def mount_for(self, file_path):
        """(volumeMount, volume) holding file_path."""
        best = None
        for m in self.spec.get("volumeMounts", []):
            mp = m["mountPath"].rstrip("/")
            if file_path == mp or file_path.startswith(mp + "/"):
                if best is None or len(mp) > len(best["mountPath"]):
                    best = m
        if best is None:
            return None, None
        volumes = {v["name"]: v for v in self.pod.get("volumes", [])}
        return best, volumes.get(best["name"])

    def configmap_file(self, file_path):
        """The ConfigMap data a file in a configMap volume holds."""
        m, vol = self.mount_for(file_path)
        assert vol is not None, "%s: %s is on no volume" % (self.where,
                                                           file_path)
        assert "configMap" in vol, "%s: %s is not from a ConfigMap" % (
            self.where, file_path)
        rel = os.path.relpath(file_path, m["mountPath"])
        key = rel
        items = vol["configMap"].get("items")
        if items is not None:
            keys = [i["key"] for i in items if i["path"] == rel]
            assert keys, "%s: no item for %s" % (self.where, rel)
            key = keys[0]
        cm = find(self.resources, "ConfigMap", vol["configMap"]["name"])
        assert cm is not None, "%s: no ConfigMap %s" % (
            self.where, vol["configMap"]["name"])
        assert key in cm.get("data", {}), "%s: ConfigMap %s has no key %s" % (
            self.where, vol["configMap"]["name"], key)
        return cm["data"][key]

    def resolved(self):
        """(args with flagfiles on disk, effective flags)."""
        out = []
        for a in self.args():
            if a.startswith("--flagfile="):
                content = self.configmap_file(a[len("--flagfile="):])
                p = os.path.join(lib.tmpdir("flagfile"),
                                 os.path.basename(a))
                with open(p, "w") as f:
                    f.write(content)
                a = "--flagfile=" + p
            out.append(a)
        return out, lib.effective_flags(out)


def containers(build_name):
    resources = build(build_name)
    out = []
    for r in resources:
        for label, template in lib.pod_templates(r):
            for spec in template["spec"]["containers"]:
                out.append(Container(build_name, resources, r, label,
                                     template, spec))
    return out


def all_containers():
    return [c for name in BUILDS for c in containers(name)]


class KustomizeStructureTest(unittest.TestCase):

    def test_every_file_is_used_and_every_reference_exists(self):
        k = lib.Kustomize()
        for name, directory in BUILDS.items():
            # Missing resources, components, patches or generator files
            # raise here.
            self.assertTrue(k.build(directory), name)
        on_disk = set()
        for p in glob.glob(os.path.join(K8S, "**", "*"), recursive=True):
            if os.path.isfile(p):
                on_disk.add(os.path.realpath(p))
        self.assertEqual(on_disk - k.files_read, set(),
                         "files no build uses")

    def test_names_are_unique(self):
        for name in BUILDS:
            seen = set()
            for r in build(name):
                key = (r["kind"], r["metadata"].get("namespace"),
                       r["metadata"]["name"])
                self.assertNotIn(key, seen, name)
                seen.add(key)

    def test_same_output_as_kubectl_kustomize(self):
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            self.skipTest("kubectl is not installed: the manifests were built "
                          "by this test's kustomize only")
        # kustomize does not read the runfiles tree's symlinks: a copy.
        copy = os.path.join(lib.tmpdir("k8s-copy"), "k8s")
        shutil.copytree(K8S, copy, symlinks=False)
        for name, directory in BUILDS.items():
            directory = os.path.join(copy, os.path.relpath(directory, K8S))
            r = subprocess.run([kubectl, "kustomize", directory],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            theirs = {(d["kind"], d["metadata"]["name"]): d
                      for d in yaml.safe_load_all(r.stdout) if d}
            ours = {(d["kind"], d["metadata"]["name"]): d
                    for d in build(name)}
            self.assertEqual(sorted(theirs), sorted(ours), name)
            for key in ours:
                self.assertEqual(theirs[key], ours[key], "%s %s" % (name, key))

    def test_overlay_config_is_the_reference_config(self):
        copies = os.path.join(K8S, "components", "spark-4x", "config")
        names = sorted(os.listdir(copies))
        self.assertEqual(names, sorted(
            n for n in os.listdir(SPARK_CONFIG)
            if os.path.isfile(os.path.join(SPARK_CONFIG, n))))
        for n in names:
            with open(os.path.join(copies, n)) as a, open(
                    os.path.join(SPARK_CONFIG, n)) as b:
                self.assertEqual(a.read(), b.read(), n)
        for build_name in ("spark-4x", "spark-4x-statefulset"):
            cm = find(build(build_name), "ConfigMap", "mneme-nccl")
            self.assertEqual(cm["data"], lib.parse_env_file(
                os.path.join(SPARK_CONFIG, "nccl.env")))

    def test_expected_workloads(self):
        kinds = {name: sorted((r["kind"], r["metadata"]["name"])
                              for r in build(name)
                              if lib.pod_templates(r))
                 for name in BUILDS}
        self.assertEqual(kinds["spark-4x"], [
            ("DaemonSet", "mneme-engram-store"),
            ("LeaderWorkerSet", "mneme")])
        self.assertEqual(kinds["spark-4x-statefulset"], [
            ("DaemonSet", "mneme-engram-store"),
            ("Deployment", "mneme-coordinator"),
            ("StatefulSet", "mneme-worker")])
        self.assertIsNotNone(find(build("spark-4x"), "PersistentVolume",
                                  "mneme-checkpoint"))


class ContainerTest(unittest.TestCase):

    def assertSecretItem(self, c, file_path, key):
        """file_path is the item `key` of the Secret mneme-cluster-secret,
        mounted read-only, not writable."""
        m, vol = c.mount_for(file_path)
        self.assertIsNotNone(vol, file_path)
        self.assertTrue(m.get("readOnly"), file_path)
        self.assertIn("secret", vol, file_path)
        self.assertEqual(vol["secret"]["secretName"], "mneme-cluster-secret")
        rel = os.path.relpath(file_path, m["mountPath"])
        self.assertIn({"key": key, "path": rel}, vol["secret"]["items"])
        self.assertEqual(vol["secret"]["defaultMode"] & 0o222, 0)

    def test_command_lines_pass_check_config(self):
        count = 0
        for c in all_containers():
            with self.subTest(container=c.where):
                self.assertIn(c.daemon, lib.DAEMON_BINARIES)
                self.assertEqual(c.spec["command"],
                                 ["/usr/local/bin/" + c.daemon])
                args, _ = c.resolved()
                r = lib.check_config(c.daemon, args)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stdout, "%s: config ok\n" % c.daemon)
                count += 1
        # base and spark-4x: store, rank 0 + coordinator, ranks 1-3;
        # spark-4x-statefulset: store, workers, coordinator.
        self.assertEqual(count, 11)

    def test_ports_and_probes_are_the_daemons(self):
        ports = lib.daemon_ports()
        for c in all_containers():
            with self.subTest(container=c.where):
                _, flags = c.resolved()
                grpc_port, metrics_port = ports[c.daemon]
                # The pod's address (where the kubelet probes), or every
                # address for the coordinator's public API.
                host = "0.0.0.0" if c.daemon == "mneme_coordinator" else POD_IP
                self.assertEqual(lib.host_port(flags["listen"]),
                                 (host, grpc_port))
                self.assertEqual(lib.host_port(flags["metrics_listen"]),
                                 (host, metrics_port))
                self.assertEqual(sorted(p["containerPort"]
                                        for p in c.spec["ports"]),
                                 [grpc_port, metrics_port])
                probes = {k: c.spec.get(k) for k in (
                    "startupProbe", "readinessProbe", "livenessProbe")}
                for kind, probe in probes.items():
                    self.assertIsNotNone(probe, kind)
                    if "grpc" in probe:
                        self.assertEqual(probe["grpc"]["port"], grpc_port)
                        # The standard health service, overall status.
                        self.assertEqual(probe["grpc"].get("service", ""), "")
                    else:
                        self.assertEqual(probe["httpGet"]["port"],
                                         metrics_port)
                        self.assertIn(probe["httpGet"]["path"],
                                      ("/healthz", "/readyz"))
                self.assertIn("grpc", probes["readinessProbe"])
                if c.daemon == "mneme_coordinator":
                    # Its gRPC health follows the workers: liveness and
                    # startup watch the process (/healthz) instead.
                    self.assertEqual(probes["livenessProbe"]["httpGet"]["path"],
                                     "/healthz")
                    self.assertEqual(probes["startupProbe"]["httpGet"]["path"],
                                     "/healthz")
                else:
                    for probe in probes.values():
                        self.assertIn("grpc", probe)

    def test_grace_covers_prestop_and_drain(self):
        for c in all_containers():
            with self.subTest(container=c.where):
                _, flags = c.resolved()
                drain = lib.parse_duration(flags.get("drain_timeout", "30s"))
                pre_stop = c.spec["lifecycle"]["preStop"]["sleep"]["seconds"]
                grace = c.pod["terminationGracePeriodSeconds"]
                self.assertGreater(grace, pre_stop + drain)

    def test_gpu_requests(self):
        for c in all_containers():
            with self.subTest(container=c.where):
                resources = c.spec.get("resources", {})
                requests = resources.get("requests", {})
                limits = resources.get("limits", {})
                if c.daemon == "mneme_worker":
                    self.assertEqual(requests.get("nvidia.com/gpu"), 1)
                    self.assertEqual(limits.get("nvidia.com/gpu"), 1)
                else:
                    self.assertNotIn("nvidia.com/gpu", requests)
                    self.assertNotIn("nvidia.com/gpu", limits)

    def test_volumes_and_references(self):
        for c in all_containers():
            with self.subTest(container=c.where):
                _, flags = c.resolved()
                for key in ("checkpoint", "local_copy_dir"):
                    if key not in flags:
                        continue
                    m, vol = c.mount_for(flags[key])
                    self.assertIsNotNone(vol, key)
                    self.assertTrue(m.get("readOnly"), key)
                    if key == "checkpoint":
                        claim = vol["persistentVolumeClaim"]["claimName"]
                        self.assertIsNotNone(find(
                            c.resources, "PersistentVolumeClaim", claim))
                    else:
                        self.assertEqual(vol["hostPath"]["type"], "Directory")
                # Every daemon reads the cluster secret from the Secret the
                # operator creates (docs/DEPLOY.md), mounted read-only.
                self.assertIn("cluster_secret_file", flags)
                self.assertSecretItem(c, flags["cluster_secret_file"],
                                      "cluster_secret")
                # The coordinator's public APIs (its Serving API listens on
                # every address) need the API key, the Secret's item
                # api_key; no other daemon is given the key.
                if c.daemon == "mneme_coordinator":
                    self.assertIn("http_api_key_file", flags)
                    self.assertSecretItem(c, flags["http_api_key_file"],
                                          "api_key")
                else:
                    self.assertNotIn("http_api_key_file", flags)
                    for m in c.spec.get("volumeMounts", []):
                        vol = {v["name"]: v for v in c.pod["volumes"]}[
                            m["name"]]
                        items = vol.get("secret", {}).get("items", [])
                        self.assertNotIn("api_key",
                                         [i["key"] for i in items], m["name"])
                for vol in c.pod.get("volumes", []):
                    if "configMap" in vol:
                        cm = find(c.resources, "ConfigMap",
                                  vol["configMap"]["name"])
                        self.assertIsNotNone(cm, vol["name"])
                        for item in vol["configMap"].get("items", []):
                            self.assertIn(item["key"], cm["data"])
                for ref in c.spec.get("envFrom", []):
                    self.assertIsNotNone(find(
                        c.resources, "ConfigMap", ref["configMapRef"]["name"]))
                for e in c.spec.get("env", []):
                    ref = e.get("valueFrom", {}).get("configMapKeyRef")
                    if ref:
                        cm = find(c.resources, "ConfigMap", ref["name"])
                        self.assertIsNotNone(cm)
                        self.assertIn(ref["key"], cm["data"])
                if c.daemon == "mneme_worker":
                    self.assertEqual([r["configMapRef"]["name"]
                                      for r in c.spec["envFrom"]],
                                     ["mneme-nccl"])


class TopologyTest(unittest.TestCase):

    def test_group_and_workers(self):
        ports = lib.daemon_ports()
        for name in BUILDS:
            cs = containers(name)
            stores = [c for c in cs if c.daemon == "mneme_engram_store"]
            workers = [c for c in cs if c.daemon == "mneme_worker"]
            coordinators = [c for c in cs if c.daemon == "mneme_coordinator"]
            with self.subTest(build=name):
                self.assertEqual(len(stores), 1)
                self.assertEqual(len(coordinators), 1)
                self.assertIn(len(workers), (1, 2))
                store_flags = stores[0].resolved()[1]
                self.assertTrue(stores[0].pod["hostNetwork"])
                for w in workers:
                    flags = w.resolved()[1]
                    tp = int(flags["tp_size"])
                    self.assertEqual(int(store_flags["tp_size"]), tp)
                    self.assertEqual(store_flags["ranks"].split(","),
                                     [str(r) for r in range(tp)])
                    self.assertTrue(w.pod["hostNetwork"])
                    # The store of the same node, where it listens.
                    self.assertEqual(flags["engram_store"],
                                     store_flags["listen"])
                    self.assertEqual(flags["comm_host"], POD_IP)
                    workload = w.workload
                    if workload["kind"] == "LeaderWorkerSet":
                        self.assertEqual(
                            workload["spec"]["leaderWorkerTemplate"]["size"],
                            tp)
                        self.assertEqual(
                            workload["spec"]["startupPolicy"], "LeaderCreated")
                        if "leader" in w.template_label:
                            # Rank 0 meets at its own address.
                            self.assertNotIn("group", flags)
                        else:
                            self.assertEqual(flags["group"], "%s:%d" % (
                                w.variables()["LWS_LEADER_ADDRESS"],
                                ports["mneme_worker"][0]))
                    else:
                        self.assertEqual(workload["spec"]["replicas"], tp)
                        self.assertEqual(
                            workload["spec"]["podManagementPolicy"],
                            "Parallel")
                        service = find(w.resources, "Service",
                                       workload["spec"]["serviceName"])
                        self.assertEqual(service["spec"]["clusterIP"], "None")
                        self.assertTrue(
                            service["spec"]["publishNotReadyAddresses"])
                        self.assertEqual(flags["group"], "%s-0.%s:%d" % (
                            workload["metadata"]["name"],
                            workload["spec"]["serviceName"],
                            ports["mneme_worker"][0]))
                coordinator = coordinators[0].resolved()[1]
                addresses = coordinator["workers"].split(",")
                if coordinators[0].workload["kind"] == "LeaderWorkerSet":
                    # Rank 0 beside it, ranks 1-3 by the LeaderWorkerSet's
                    # pod names (leader name, index) in its Service.
                    name = coordinators[0].workload["metadata"]["name"]
                    self.assertEqual(addresses, ["%s:%d" % (
                        POD_IP, ports["mneme_worker"][0])] + [
                        "%s-0-%d.%s:%d" % (name, r, name,
                                           ports["mneme_worker"][0])
                        for r in range(1, 4)])
                self.assertEqual(len(addresses),
                                 int(workers[0].resolved()[1]["tp_size"]))
                for a in addresses:
                    self.assertEqual(lib.host_port(a)[1],
                                     ports["mneme_worker"][0])
                # The API Service selects the coordinator's pod.
                api = find(coordinators[0].resources, "Service", "mneme-api")
                labels = coordinators[0].template["metadata"]["labels"]
                for k, v in api["spec"]["selector"].items():
                    self.assertEqual(labels.get(k), v, k)
                self.assertEqual(sorted(p["targetPort"]
                                        for p in api["spec"]["ports"]),
                                 list(ports["mneme_coordinator"]))


if __name__ == "__main__":
    lib.main()
