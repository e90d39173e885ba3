"""Helpers shared by the deploy tests: where things are, how systemd reads unit
files, environment files and command lines, how Abseil reads flagfiles, a
small kustomize for the manifests in deploy/k8s, and a unittest runner that
writes the JUnit XML Bazel reads.

Only the Python standard library and PyYAML (python3-yaml) are used.
"""

import copy
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import unittest
import xml.etree.ElementTree as ET

import yaml

# ---------------------------------------------------------------------------
# Paths.


def root():
    """The repository as the test sees it (its runfiles tree under Bazel)."""
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:
        return os.path.join(srcdir, os.environ.get("TEST_WORKSPACE", "mneme"))
    return os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))


def path(*parts):
    return os.path.join(root(), *parts)


def tmpdir(name):
    """A fresh directory under $TEST_TMPDIR."""
    base = os.environ.get("TEST_TMPDIR", "/tmp")
    d = os.path.join(base, name)
    n = 0
    while os.path.exists(d):
        n += 1
        d = os.path.join(base, "%s.%d" % (name, n))
    os.makedirs(d)
    return d


# Each daemon: its binary in the tree, its systemd unit, and the fixed ports
# it listens on by default (daemon_ports()).
DAEMON_BINARIES = {
    "mneme_engram_store": "services/engram/mneme_engram_store",
    "mneme_worker": "services/worker/mneme_worker",
    "mneme_coordinator": "services/coordinator/mneme_coordinator",
}
DAEMON_UNITS = {
    "mneme_engram_store": "mneme-engram-store",
    "mneme_worker": "mneme-worker",
    "mneme_coordinator": "mneme-coordinator",
}
UNIT_DAEMONS = {unit: daemon for daemon, unit in DAEMON_UNITS.items()}


def binary(daemon):
    return path(DAEMON_BINARIES[daemon])


def mneme_tool():
    return path("tools", "mneme")


_PORTS = None


# kEngramStorePort and kEngramStoreMetricsPort of services/engram/
# engram_flags.h, whose library is private to its package.
ENGRAM_STORE_PORTS = (50151, 50152)


def daemon_ports():
    """{daemon: (grpc_port, metrics_port)}: the worker's and coordinator's
    from their headers (//tests/deploy:daemon_ports), the store's above."""
    global _PORTS
    if _PORTS is None:
        out = subprocess.run([path("tests", "deploy", "daemon_ports")],
                             check=True, capture_output=True, text=True).stdout
        _PORTS = {k: tuple(v) for k, v in json.loads(out).items()}
        _PORTS["mneme_engram_store"] = ENGRAM_STORE_PORTS
    return _PORTS


# ---------------------------------------------------------------------------
# systemd: unit files, environment files, command lines.


class Unit:
    """A unit file as systemd reads it: sections of (key, value) in order."""

    def __init__(self, file_path):
        self.path = file_path
        self.sections = {}
        section = None
        pending = ""
        with open(file_path) as f:
            for raw in f:
                line = raw.rstrip("\n")
                if pending:
                    line = pending + " " + line.strip()
                    pending = ""
                stripped = line.strip()
                if not stripped or stripped[0] in "#;":
                    continue
                if stripped.endswith("\\"):
                    pending = stripped[:-1].rstrip()
                    continue
                if stripped.startswith("[") and stripped.endswith("]"):
                    section = stripped[1:-1]
                    self.sections.setdefault(section, [])
                    continue
                if section is None or "=" not in stripped:
                    raise ValueError("%s: cannot parse %r" % (file_path, raw))
                key, value = stripped.split("=", 1)
                self.sections[section].append((key.strip(), value.strip()))

    def all(self, section, key):
        return [v for k, v in self.sections.get(section, []) if k == key]

    def get(self, section, key, default=None):
        values = self.all(section, key)
        return values[-1] if values else default

    def words(self, section, key):
        """Every whitespace-separated word of every value of a list key."""
        out = []
        for v in self.all(section, key):
            out.extend(v.split())
        return out


def parse_env_file(file_path):
    """An EnvironmentFile= as systemd reads it: KEY=VALUE lines, # or ;
    comments, surrounding whitespace and one pair of quotes removed."""
    env = {}
    with open(file_path) as f:
        for raw in f:
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if "=" not in line:
                raise ValueError("%s: cannot parse %r" % (file_path, raw))
            key, value = line.split("=", 1)
            key, value = key.strip(), value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            env[key] = value
    return env


_WORD_VAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_BRACED_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_exec(command, env):
    """The argv systemd runs for an ExecStart= value: words split as by a
    shell, a word that is exactly $NAME replaced by the value split at
    whitespace (zero or more words), ${NAME} replaced by the exact value
    (empty when unset) inside a word. Returns (argv, names used)."""
    used = set()
    argv = []
    for word in shlex.split(command):
        m = _WORD_VAR.fullmatch(word)
        if m:
            used.add(m.group(1))
            argv.extend(env.get(m.group(1), "").split())
            continue

        def braced(match):
            used.add(match.group(1))
            return env.get(match.group(1), "")

        argv.append(_BRACED_VAR.sub(braced, word).replace("$$", "$"))
    return argv, used


def parse_timespan(text):
    """A systemd time span ("45s", "30min", "1h 30min", "500ms") in seconds."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "sec": 1, "m": 60, "min": 60,
             "h": 3600, "hr": 3600, "d": 86400}
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return float(text)
    total = 0.0
    pos = 0
    for m in re.finditer(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)", text):
        if m.start() != pos or m.group(2) not in units:
            raise ValueError("bad time span %r" % text)
        total += float(m.group(1)) * units[m.group(2)]
        pos = m.end()
    if pos != len(text):
        raise ValueError("bad time span %r" % text)
    return total


# ---------------------------------------------------------------------------
# Abseil flags.


def read_flagfile(file_path):
    """The flags of an Abseil flagfile: one per line; lines starting with #
    or // are comments; surrounding whitespace ignored."""
    flags = []
    with open(file_path) as f:
        for raw in f:
            line = raw.strip()
            if not line or line.startswith("#") or line.startswith("//"):
                continue
            flags.append(line)
    return flags


def effective_flags(args, flagfile_paths=None):
    """{name: value} of a command line (argv without argv[0]) as Abseil sees
    it: --flagfile=F expanded in place (F mapped through flagfile_paths when
    given), later flags overriding earlier ones; --name alone is "true"."""
    flagfile_paths = flagfile_paths or {}
    out = {}
    for arg in args:
        if not arg.startswith("--"):
            raise ValueError("not a flag: %r" % arg)
        name, sep, value = arg[2:].partition("=")
        if name == "flagfile":
            out.update(effective_flags(
                read_flagfile(flagfile_paths.get(value, value))))
            continue
        out[name] = value if sep else "true"
    return out


def parse_duration(text):
    """An Abseil duration ("30s", "5m", "1h30m", "250ms") in seconds."""
    units = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    if text == "0":
        return 0.0
    total = 0.0
    pos = 0
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)", text):
        if m.start() != pos:
            raise ValueError("bad duration %r" % text)
        total += float(m.group(1)) * units[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise ValueError("bad duration %r" % text)
    return total


def host_port(text):
    host, _, port = text.rpartition(":")
    return host, int(port)


def check_config(daemon, args, env=None, timeout=60):
    """Runs the daemon's --check_config on args; the CompletedProcess."""
    argv = [binary(daemon)] + list(args) + ["--check_config"]
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(argv, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


# ---------------------------------------------------------------------------
# Sockets.


def port_is_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(offsets, start=20000, stop=60000, step=1000):
    """A base port such that base + every offset is free on 127.0.0.1."""
    for base in range(start + (os.getpid() % 17) * step, stop, step):
        if all(port_is_free(base + o) for o in offsets):
            return base
    raise RuntimeError("no free block of ports")


class NotifySocket:
    """An abstract datagram socket standing in for systemd's notify socket."""

    def __init__(self):
        self.name = "mneme-deploy-test-%d-%d" % (os.getpid(), id(self))
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name)
        self.sock.settimeout(0.1)
        self.received = []

    def env_value(self):
        return "@" + self.name

    def wait_for(self, want, timeout):
        """Collects messages until one equals want; False after timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(4096).decode()
            except socket.timeout:
                continue
            for line in data.split("\n"):
                self.received.append(line)
                if line == want:
                    return True
        return False

    def close(self):
        self.sock.close()


# ---------------------------------------------------------------------------
# kustomize (the subset deploy/k8s uses).

# Kinds without a namespace among those the manifests use.
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "ClusterRole",
                  "ClusterRoleBinding", "CustomResourceDefinition",
                  "StorageClass"}


def _load_yaml_docs(file_path):
    with open(file_path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def _kustomization_file(directory):
    for name in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        p = os.path.join(directory, name)
        if os.path.isfile(p):
            return p
    raise FileNotFoundError("no kustomization file in %s" % directory)


def _env_data(file_path):
    data = {}
    with open(file_path) as f:
        for raw in f:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            data[key.strip()] = value
    return data


def _match(res, target):
    api = res.get("apiVersion", "")
    group = api.split("/")[0] if "/" in api else ""
    if "group" in target and target["group"] != group:
        return False
    if "kind" in target and target["kind"] != res.get("kind"):
        return False
    if "name" in target and target["name"] != res["metadata"].get("name"):
        return False
    return True


def _pointer(doc, pointer):
    parts = [p.replace("~1", "/").replace("~0", "~")
             for p in pointer.split("/")[1:]]
    parent = doc
    for p in parts[:-1]:
        parent = parent[int(p)] if isinstance(parent, list) else parent[p]
    return parent, parts[-1]


def _apply_json6902(res, ops):
    for op in ops:
        parent, key = _pointer(res, op["path"])
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                idx = len(parent) if key == "-" else int(key)
                if op["op"] == "add":
                    parent.insert(idx, copy.deepcopy(op["value"]))
                else:
                    parent[idx] = copy.deepcopy(op["value"])
            else:
                if op["op"] == "replace" and key not in parent:
                    raise KeyError("replace of missing %s" % op["path"])
                parent[key] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            if isinstance(parent, list):
                del parent[int(key)]
            else:
                del parent[key]
        else:
            raise NotImplementedError("JSON patch op %s" % op["op"])


def _set_image(node, image):
    """kustomize's images transformer: every container of any resource."""
    if isinstance(node, list):
        for item in node:
            _set_image(item, image)
        return
    if not isinstance(node, dict):
        return
    for key in ("containers", "initContainers"):
        for c in node.get(key) or []:
            current = c.get("image", "")
            name, tag = current, ""
            if "@" in current:
                name, tag = current.split("@", 1)
                tag = "@" + tag
            elif ":" in current.rsplit("/", 1)[-1]:
                name, tag = current.rsplit(":", 1)
                tag = ":" + tag
            if name != image["name"]:
                continue
            if "newTag" in image:
                tag = ":" + str(image["newTag"])
            if "digest" in image:
                tag = "@" + image["digest"]
            c["image"] = image.get("newName", name) + tag
    for value in node.values():
        _set_image(value, image)


class Kustomize:
    """Builds a kustomization directory the way `kustomize build` does for the
    features deploy/k8s uses: resources (files and kustomization
    directories), components, configMapGenerator (files, envs; behavior
    create/replace/merge) with disableNameSuffixHash, patches (JSON 6902
    lists with a target, and `$patch: delete`), images and namespace. Anything else
    raises NotImplementedError, so a manifest using more fails the tests
    rather than being checked wrongly. Records every file it read."""

    SUPPORTED = {"apiVersion", "kind", "resources", "components", "namespace",
                 "configMapGenerator", "generatorOptions", "patches", "images"}

    def __init__(self):
        self.files_read = set()

    def build(self, directory):
        return self._build(os.path.abspath(directory), [], "Kustomization")

    def _build(self, directory, accumulated, want_kind):
        kfile = _kustomization_file(directory)
        self.files_read.add(os.path.realpath(kfile))
        with open(kfile) as f:
            k = yaml.safe_load(f)
        kind = k.get("kind", "Kustomization")
        if kind != want_kind:
            raise ValueError("%s: kind %s, expected %s" % (kfile, kind,
                                                           want_kind))
        unknown = set(k) - self.SUPPORTED
        if unknown:
            raise NotImplementedError("%s: %s" % (kfile, sorted(unknown)))
        res = list(accumulated)
        for r in k.get("resources", []):
            p = os.path.normpath(os.path.join(directory, r))
            if os.path.isdir(p):
                res.extend(self._build(p, [], "Kustomization"))
            elif os.path.isfile(p):
                self.files_read.add(os.path.realpath(p))
                res.extend(_load_yaml_docs(p))
            else:
                raise FileNotFoundError("%s: resource %s does not exist" %
                                        (kfile, r))
        for c in k.get("components", []):
            p = os.path.normpath(os.path.join(directory, c))
            if not os.path.isdir(p):
                raise FileNotFoundError("%s: component %s does not exist" %
                                        (kfile, c))
            res = self._build(p, res, "Component")
        options = k.get("generatorOptions", {})
        if set(options) - {"disableNameSuffixHash"} or (
                k.get("configMapGenerator") and
                not options.get("disableNameSuffixHash")):
            raise NotImplementedError("%s: generatorOptions %s" %
                                      (kfile, options))
        for gen in k.get("configMapGenerator", []):
            res = self._generate(directory, kfile, gen, res)
        for patch in k.get("patches", []):
            res = self._patch(directory, kfile, patch, res)
        for image in k.get("images", []):
            for r in res:
                _set_image(r, image)
        if "namespace" in k:
            for r in res:
                if r["kind"] not in CLUSTER_SCOPED:
                    r["metadata"]["namespace"] = k["namespace"]
        return res

    def _generate(self, directory, kfile, gen, res):
        if set(gen) - {"name", "files", "envs", "behavior"}:
            raise NotImplementedError("%s: configMapGenerator %s" %
                                      (kfile, sorted(gen)))
        data = {}
        for entry in gen.get("files", []):
            key, sep, rel = entry.partition("=")
            if not sep:
                key, rel = os.path.basename(entry), entry
            p = os.path.join(directory, rel)
            if not os.path.isfile(p):
                raise FileNotFoundError("%s: file %s does not exist" %
                                        (kfile, rel))
            self.files_read.add(os.path.realpath(p))
            with open(p) as f:
                data[key] = f.read()
        for rel in gen.get("envs", []):
            p = os.path.join(directory, rel)
            if not os.path.isfile(p):
                raise FileNotFoundError("%s: env file %s does not exist" %
                                        (kfile, rel))
            self.files_read.add(os.path.realpath(p))
            data.update(_env_data(p))
        behavior = gen.get("behavior", "create")
        existing = [r for r in res if r["kind"] == "ConfigMap" and
                    r["metadata"]["name"] == gen["name"]]
        if behavior == "create":
            if existing:
                raise ValueError("%s: ConfigMap %s exists" % (kfile,
                                                              gen["name"]))
            res.append({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": gen["name"]}, "data": data})
        elif behavior in ("replace", "merge"):
            if len(existing) != 1:
                raise ValueError("%s: no ConfigMap %s to %s" %
                                 (kfile, gen["name"], behavior))
            if behavior == "replace":
                existing[0]["data"] = data
            else:
                existing[0].setdefault("data", {}).update(data)
        else:
            raise NotImplementedError("behavior %s" % behavior)
        return res

    def _patch(self, directory, kfile, patch, res):
        if set(patch) - {"path", "target"}:
            raise NotImplementedError("%s: patch %s" % (kfile, sorted(patch)))
        p = os.path.join(directory, patch["path"])
        if not os.path.isfile(p):
            raise FileNotFoundError("%s: patch %s does not exist" %
                                    (kfile, patch["path"]))
        self.files_read.add(os.path.realpath(p))
        with open(p) as f:
            body = yaml.safe_load(f)
        if isinstance(body, list):
            target = patch.get("target")
            if not target:
                raise ValueError("%s: a JSON 6902 patch needs a target" % kfile)
            for r in res:
                if _match(r, target):
                    _apply_json6902(r, body)
            return res
        if isinstance(body, dict) and body.get("$patch") == "delete":
            target = {"kind": body["kind"], "name": body["metadata"]["name"]}
            kept = [r for r in res if not _match(r, target)]
            if len(kept) == len(res):
                raise ValueError("%s: nothing to delete for %s" % (kfile,
                                                                   target))
            return kept
        raise NotImplementedError("%s: strategic merge patches" % p)


def pod_templates(resource):
    """(label, pod template) of a workload: one for Deployments, DaemonSets and
    StatefulSets, the leader's and the workers' for a LeaderWorkerSet."""
    kind = resource["kind"]
    if kind in ("Deployment", "DaemonSet", "StatefulSet"):
        return [(kind, resource["spec"]["template"])]
    if kind == "LeaderWorkerSet":
        lwt = resource["spec"]["leaderWorkerTemplate"]
        return [("LeaderWorkerSet leader", lwt["leaderTemplate"]),
                ("LeaderWorkerSet worker", lwt["workerTemplate"])]
    return []


# ---------------------------------------------------------------------------
# The unittest runner that writes $XML_OUTPUT_FILE (tests/testing).

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testing"))
from junit_runner import main  # noqa: E402,F401
