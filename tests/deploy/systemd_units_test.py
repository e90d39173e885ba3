"""The systemd units in deploy/systemd: `systemd-analyze verify` and
`systemd-analyze security --offline` pass, the units agree with the daemons
(notify protocol, watchdog, drain deadline, ports) and the reference
configuration, and install.sh installs them idempotently.

PID 1 is not systemd where this runs, so the units are verified as files:
systemd-analyze verify loads them from a temporary directory. It needs every
ExecStart binary to exist, so the copy verified has /usr/local/bin/ replaced
by a directory of links to the daemons Bazel built; nothing else differs
(asserted).
"""

import filecmp
import os
import shutil
import subprocess
import unittest

import deploy_lib as lib

SYSTEMD_DIR = lib.path("deploy", "systemd")
CONFIG_DIR = lib.path("deploy", "config", "spark-4x")
SERVICES = ["mneme-engram-store", "mneme-worker", "mneme-coordinator"]
UNIT_FILES = ["%s.service" % s for s in SERVICES] + ["mneme.target"]
# Highest `systemd-analyze security` exposure (x10) allowed per unit. The
# worker keeps the GPU and RDMA devices, netlink and W+X memory (CUDA).
EXPOSURE_LIMITS = {"mneme-engram-store": 20, "mneme-worker": 40,
                   "mneme-coordinator": 20}


def unit(name):
    return lib.Unit(os.path.join(SYSTEMD_DIR, name + ".service"))


def verifiable_copy(tag):
    """The units in a temporary directory, ExecStart binaries pointing at the
    built daemons. Returns the directory."""
    out = lib.tmpdir(tag)
    bin_dir = os.path.join(out, "bin")
    os.makedirs(bin_dir)
    for daemon in lib.DAEMON_BINARIES:
        os.symlink(lib.binary(daemon), os.path.join(bin_dir, daemon))
    for name in UNIT_FILES:
        with open(os.path.join(SYSTEMD_DIR, name)) as f:
            text = f.read()
        with open(os.path.join(out, name), "w") as f:
            f.write(text.replace("/usr/local/bin/", bin_dir + "/"))
    return out


def analyze(*args):
    return subprocess.run(["systemd-analyze"] + list(args), capture_output=True,
                          text=True, timeout=60)


class SystemdAnalyzeTest(unittest.TestCase):

    def test_verify_passes_without_a_message(self):
        d = verifiable_copy("verify")
        r = analyze("verify", "--man=no",
                    *[os.path.join(d, n) for n in UNIT_FILES])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # Unknown keys and bad values are only warnings: any output fails.
        self.assertEqual(r.stdout + r.stderr, "")

    def test_verify_reports_a_broken_unit(self):
        # The check above is live: a typo and a missing binary are reported.
        d = verifiable_copy("verify-broken")
        p = os.path.join(d, "mneme-worker.service")
        with open(p) as f:
            text = f.read()
        text = text.replace("LimitMEMLOCK=", "LimitMEMLOK=")
        text = text.replace(os.path.join(d, "bin", "mneme_worker"),
                            os.path.join(d, "bin", "missing"))
        with open(p, "w") as f:
            f.write(text)
        r = analyze("verify", "--man=no", p)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("LimitMEMLOK", r.stderr)
        self.assertIn("is not executable", r.stderr)

    def test_security_exposure(self):
        d = verifiable_copy("security")
        for service, limit in EXPOSURE_LIMITS.items():
            r = analyze("security", "--offline=yes", "--man=no",
                        "--threshold=%d" % limit,
                        os.path.join(d, service + ".service"))
            self.assertEqual(r.returncode, 0, "%s over %d:\n%s" % (
                service, limit, r.stdout[-600:] + r.stderr))


class UnitContentTest(unittest.TestCase):

    def test_only_exec_start_paths_differ_in_the_verified_copy(self):
        d = verifiable_copy("diff")
        for name in UNIT_FILES:
            with open(os.path.join(SYSTEMD_DIR, name)) as f:
                original = f.read().splitlines()
            with open(os.path.join(d, name)) as f:
                verified = f.read().splitlines()
            self.assertEqual(len(original), len(verified))
            for a, b in zip(original, verified):
                if a != b:
                    self.assertTrue(a.startswith("ExecStart=/usr/local/bin/"),
                                    a)

    def test_notify_watchdog_restart_and_limits(self):
        for service in SERVICES:
            u = unit(service)
            with self.subTest(service=service):
                self.assertEqual(u.get("Service", "Type"), "notify")
                self.assertEqual(u.get("Service", "NotifyAccess"), "main")
                # The daemons ping at half of WATCHDOG_USEC; 30 s leaves room
                # for a slow ping without restarting a healthy daemon.
                watchdog = lib.parse_timespan(u.get("Service", "WatchdogSec"))
                self.assertGreaterEqual(watchdog, 10)
                self.assertEqual(u.get("Service", "Restart"), "on-failure")
                self.assertEqual(u.get("Service", "LimitMEMLOCK"), "infinity")
                self.assertEqual(u.get("Service", "User"), "mneme")
                self.assertEqual(u.get("Service", "Group"), "mneme")
                self.assertIn("mneme.target", u.all("Unit", "PartOf"))
                self.assertIn("mneme.target", u.all("Install", "WantedBy"))

    def test_sandboxing(self):
        for service in SERVICES:
            u = unit(service)
            with self.subTest(service=service):
                self.assertEqual(u.get("Service", "ProtectSystem"), "strict")
                self.assertEqual(u.get("Service", "ProtectHome"), "yes")
                self.assertEqual(u.get("Service", "NoNewPrivileges"), "yes")
                self.assertEqual(u.get("Service", "PrivateTmp"), "yes")
                self.assertEqual(u.get("Service", "CapabilityBoundingSet"), "")
        # What the daemons write: the store its RocksDB tier, the worker
        # CUDA's cache. The local copy (/var/lib/mneme) is only read.
        for service in ("mneme-engram-store", "mneme-worker"):
            self.assertEqual(unit(service).words("Service", "ReadWritePaths"),
                             ["/var/cache/mneme"])
        self.assertEqual(unit("mneme-coordinator").words(
            "Service", "ReadWritePaths"), [])
        self.assertTrue(unit("mneme-worker").get(
            "Service", "Environment").startswith("CUDA_CACHE_PATH=/var/cache/"))

    def test_ordering(self):
        worker = unit("mneme-worker")
        self.assertIn("mneme-engram-store.service", worker.words("Unit",
                                                                 "After"))
        self.assertIn("mneme-engram-store.service", worker.words("Unit",
                                                                 "Wants"))
        coordinator = unit("mneme-coordinator")
        self.assertIn("mneme-worker.service", coordinator.words("Unit",
                                                                "After"))
        for service in ("mneme-engram-store", "mneme-worker"):
            self.assertEqual(unit(service).words("Unit", "RequiresMountsFor"),
                             ["/mnt/mneme/checkpoint"])
        target = lib.Unit(os.path.join(SYSTEMD_DIR, "mneme.target"))
        self.assertIn("multi-user.target", target.all("Install", "WantedBy"))

    def test_exec_start_reads_the_reference_config(self):
        for service in SERVICES:
            u = unit(service)
            daemon = lib.UNIT_DAEMONS[service]
            with self.subTest(service=service):
                env_files = u.all("Service", "EnvironmentFile")
                self.assertIn("/etc/mneme/%s.env" % service, env_files)
                argv, used = lib.expand_exec(u.get("Service", "ExecStart"), {})
                self.assertEqual(argv[0], "/usr/local/bin/" + daemon)
                self.assertEqual(argv[1],
                                 "--flagfile=/etc/mneme/%s.flags" % service)
                self.assertTrue(os.path.isfile(
                    os.path.join(CONFIG_DIR, service + ".flags")))
                # Every variable the command line uses is set in the env
                # file of every node that runs the service.
                for node in sorted(os.listdir(os.path.join(CONFIG_DIR,
                                                           "nodes"))):
                    env = {}
                    for ef in env_files:
                        local = os.path.join(CONFIG_DIR, os.path.basename(ef))
                        if not os.path.exists(local):
                            local = os.path.join(CONFIG_DIR, "nodes", node,
                                                 os.path.basename(ef))
                        if os.path.exists(local):
                            env.update(lib.parse_env_file(local))
                    node_env = os.path.join(CONFIG_DIR, "nodes", node,
                                            service + ".env")
                    if not os.path.exists(node_env):
                        continue
                    self.assertEqual(used - set(env), set(),
                                     "%s on %s" % (service, node))

    def test_stop_and_start_timeouts_fit_the_daemons(self):
        for service in SERVICES:
            u = unit(service)
            flags = lib.effective_flags(lib.read_flagfile(
                os.path.join(CONFIG_DIR, service + ".flags")))
            drain = lib.parse_duration(flags.get("drain_timeout", "30s"))
            stop = lib.parse_timespan(u.get("Service", "TimeoutStopSec"))
            with self.subTest(service=service):
                # Drain, then the rest of the shutdown, before SIGKILL.
                self.assertGreaterEqual(stop, drain + 10)
                self.assertIsNotNone(u.get("Service", "TimeoutStartSec"))
        worker = lib.effective_flags(lib.read_flagfile(
            os.path.join(CONFIG_DIR, "mneme-worker.flags")))
        start = lib.parse_timespan(unit("mneme-worker").get(
            "Service", "TimeoutStartSec"))
        # Joining the group may take --comm_timeout, then the shard loads.
        self.assertGreater(start, 2 * lib.parse_duration(
            worker["comm_timeout"]))
        self.assertIn("/etc/mneme/nccl.env", unit("mneme-worker").all(
            "Service", "EnvironmentFile"))


class InstallScriptTest(unittest.TestCase):

    def run_install(self, destdir, *args):
        env = dict(os.environ, DESTDIR=destdir)
        return subprocess.run(
            ["bash", os.path.join(SYSTEMD_DIR, "install.sh"),
             "--bin-dir", lib.root(), "--config", CONFIG_DIR] + list(args),
            capture_output=True, text=True, env=env, timeout=120)

    def tree(self, d):
        out = {}
        for dirpath, _, files in os.walk(d):
            for name in files:
                p = os.path.join(dirpath, name)
                st = os.stat(p)
                with open(p, "rb") as f:
                    out[os.path.relpath(p, d)] = (f.read(), st.st_mode)
        return out

    def test_dry_run_changes_nothing(self):
        d = os.path.join(lib.tmpdir("install-dry"), "root")
        r = self.run_install(d, "--node", "spark-1", "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.exists(d))
        self.assertIn("would install %s/etc/systemd/system/mneme-worker.service"
                      % d, r.stdout)

    def test_installs_idempotently(self):
        d = lib.tmpdir("install")
        r = self.run_install(d, "--node", "spark-0")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for name in UNIT_FILES:
            self.assertTrue(filecmp.cmp(
                os.path.join(SYSTEMD_DIR, name),
                os.path.join(d, "etc/systemd/system", name), shallow=False))
        for name in ("mneme-engram-store.flags", "mneme-worker.flags",
                     "mneme-coordinator.flags", "nccl.env"):
            self.assertTrue(filecmp.cmp(os.path.join(CONFIG_DIR, name),
                                        os.path.join(d, "etc/mneme", name),
                                        shallow=False))
        for name in ("mneme-engram-store.env", "mneme-worker.env",
                     "mneme-coordinator.env"):
            self.assertTrue(filecmp.cmp(
                os.path.join(CONFIG_DIR, "nodes/spark-0", name),
                os.path.join(d, "etc/mneme", name), shallow=False))
        for daemon in lib.DAEMON_BINARIES:
            p = os.path.join(d, "usr/local/bin", daemon)
            self.assertTrue(os.access(p, os.X_OK), p)
        self.assertTrue(os.path.isfile(os.path.join(
            d, "usr/local/share/doc/mneme/DEPLOY.md")))
        for sub in ("var/lib/mneme/local", "var/cache/mneme"):
            self.assertTrue(os.path.isdir(os.path.join(d, sub)))

        before = self.tree(d)
        again = self.run_install(d, "--node", "spark-0")
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("nothing to change", again.stdout)
        self.assertEqual(self.tree(d), before)

    def test_node_settings_are_kept_unless_forced(self):
        d = lib.tmpdir("install-keep")
        self.assertEqual(self.run_install(d, "--node", "spark-2").returncode, 0)
        env = os.path.join(d, "etc/mneme/mneme-worker.env")
        with open(env, "a") as f:
            f.write("MNEME_WORKER_FLAGS=--threads=16\n")
        r = self.run_install(d, "--node", "spark-2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("keep %s" % env, r.stdout)
        with open(env) as f:
            self.assertIn("--threads=16", f.read())
        r = self.run_install(d, "--node", "spark-2", "--force-env")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(filecmp.cmp(
            os.path.join(CONFIG_DIR, "nodes/spark-2/mneme-worker.env"), env,
            shallow=False))

    def test_prefix_rewrites_exec_start(self):
        d = lib.tmpdir("install-prefix")
        r = self.run_install(d, "--node", "spark-3", "--prefix", "/opt/mneme")
        self.assertEqual(r.returncode, 0, r.stderr)
        u = lib.Unit(os.path.join(d, "etc/systemd/system/mneme-worker.service"))
        self.assertTrue(u.get("Service", "ExecStart").startswith(
            "/opt/mneme/bin/mneme_worker "))
        self.assertTrue(os.path.isfile(os.path.join(
            d, "opt/mneme/bin/mneme_worker")))

    def test_bad_arguments(self):
        d = lib.tmpdir("install-bad")
        r = self.run_install(d)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--node NAME is required", r.stderr)
        r = self.run_install(d, "--node", "spark-9")
        self.assertEqual(r.returncode, 1)
        self.assertIn("--node spark-9", r.stderr)
        shutil.rmtree(d)


if __name__ == "__main__":
    lib.main()
