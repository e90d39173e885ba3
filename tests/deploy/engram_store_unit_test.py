"""The engram store run the way mneme-engram-store.service runs it on spark-1:
the unit's ExecStart expanded with spark-1's environment file, the reference
flagfile, and the files the unit names moved under a temporary root (the
checkpoint, the local copy made by `mneme localize`, /etc/mneme) and its fixed
ports replaced by free ones. A notify socket owned by the test stands in for
systemd's, with WATCHDOG_USEC set. It must announce READY=1, feed the
watchdog, serve lookups from the local copy, and announce STOPPING=1 and exit
0 on SIGTERM within the unit's TimeoutStopSec.
"""

import os
import re
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.request

import deploy_lib as lib

UNIT = lib.path("deploy", "systemd", "mneme-engram-store.service")
CONFIG_DIR = lib.path("deploy", "config", "spark-4x")
NODE = "spark-1"
# 200 ms: pings every 100 ms, so several arrive within the test.
WATCHDOG_USEC = 200000


class EngramStoreAsUnitTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.root = lib.tmpdir("node-root")
        cls.checkpoint = os.path.join(cls.root, "mnt/mneme/checkpoint")
        r = subprocess.run(
            [lib.mneme_tool(), "make-checkpoint", "--out", cls.checkpoint],
            capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        env = lib.parse_env_file(os.path.join(
            CONFIG_DIR, "nodes", NODE, "mneme-engram-store.env"))
        cls.rank = env["MNEME_RANKS"]
        r = subprocess.run(
            [lib.mneme_tool(), "localize", "--checkpoint", cls.checkpoint,
             "--out", os.path.join(cls.root, "var/lib/mneme/local"),
             "--tp", "4", "--rank", cls.rank],
            capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        os.makedirs(os.path.join(cls.root, "var/cache/mneme"))
        cls.run_dir = tempfile.mkdtemp(prefix="mneme-run-", dir="/tmp")
        os.makedirs(os.path.join(cls.root, "etc/mneme"))
        # The cluster secret as docs/DEPLOY.md creates it.
        os.makedirs(os.path.join(cls.root, "etc/mneme-secret"))
        cls.secret_file = os.path.join(cls.root,
                                       "etc/mneme-secret/cluster_secret")
        with open(cls.secret_file, "w") as f:
            f.write(os.urandom(32).hex() + "\n")

    def substitute(self, text, used):
        """The unit's paths under the temporary root, its ports free ones."""
        rules = [
            ("/usr/local/bin/mneme_engram_store",
             lib.binary("mneme_engram_store")),
            ("/etc/mneme/", self.root + "/etc/mneme/"),
            ("/etc/mneme-secret/", self.root + "/etc/mneme-secret/"),
            ("/mnt/mneme/", self.root + "/mnt/mneme/"),
            ("/var/lib/mneme/", self.root + "/var/lib/mneme/"),
            ("/var/cache/mneme", self.root + "/var/cache/mneme"),
            # The unit's RuntimeDirectory: short, a Unix socket path is at
            # most 107 bytes.
            ("/run/mneme/", self.run_dir + "/"),
            ("127.0.0.1:50151", "127.0.0.1:0"),
            ("127.0.0.1:50152", "127.0.0.1:0"),
        ]
        for old, new in rules:
            if old in text:
                used.add(old)
                text = text.replace(old, new)
        return text

    def test_ready_watchdog_stopping(self):
        unit = lib.Unit(UNIT)
        used = set()
        # /etc/mneme as installed on spark-1: the flagfile and the env file.
        with open(os.path.join(CONFIG_DIR, "mneme-engram-store.flags")) as f:
            flags = self.substitute(f.read(), used)
        with open(os.path.join(self.root, "etc/mneme",
                               "mneme-engram-store.flags"), "w") as f:
            f.write(flags)
        env = {}
        for env_file in unit.all("Service", "EnvironmentFile"):
            self.assertEqual(os.path.dirname(env_file), "/etc/mneme")
            env.update(lib.parse_env_file(os.path.join(
                CONFIG_DIR, "nodes", NODE, os.path.basename(env_file))))
        argv, _ = lib.expand_exec(unit.get("Service", "ExecStart"), env)
        argv = [self.substitute(a, used) for a in argv]
        # Every rule matched something (the cache directory is named only
        # with a RocksDB tier): the test follows the unit and the config.
        self.assertEqual(len(used - {"/var/cache/mneme"}), 8, sorted(used))
        self.assertIn("--ranks=%s" % self.rank, argv)

        notify = lib.NotifySocket()
        child_env = dict(os.environ)
        child_env.update(env)
        child_env.update({"NOTIFY_SOCKET": notify.env_value(),
                          "WATCHDOG_USEC": str(WATCHDOG_USEC)})
        child_env.pop("WATCHDOG_PID", None)
        log = os.path.join(self.root, "store.log")
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    env=child_env)
        try:
            self.assertTrue(notify.wait_for("READY=1", 60), self.log(log))
            for _ in range(3):
                self.assertTrue(notify.wait_for("WATCHDOG=1", 10),
                                self.log(log))

            # It serves this node's rows from the local copy.
            address = self.printed(log, "listening on ")
            metrics = self.printed(log, "metrics on ")
            r = subprocess.run(
                [lib.mneme_tool(), "engram", "lookup", "--server", address,
                 "--layer", "1", "--tokens", "300,301,302",
                 "--cluster-secret-file", self.secret_file],
                capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertGreater(len(r.stdout.splitlines()), 0)
            # Without the cluster secret the store refuses the lookup.
            refused = subprocess.run(
                [lib.mneme_tool(), "engram", "lookup", "--server", address,
                 "--layer", "1", "--tokens", "300,301,302"],
                capture_output=True, text=True, timeout=60)
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn("cluster secret", refused.stderr)
            with urllib.request.urlopen("http://%s/metrics" % metrics,
                                        timeout=10) as resp:
                text = resp.read().decode()
            served = dict(re.findall(
                r'mneme_engram_rows_served_total\{tier="(\w+)"\} (\d+)', text))
            self.assertGreater(int(served["local"]), 0, text)
            self.assertEqual(int(served["source"]), 0, text)

            proc.send_signal(signal.SIGTERM)
            self.assertTrue(notify.wait_for("STOPPING=1", 10), self.log(log))
            stop = lib.parse_timespan(unit.get("Service", "TimeoutStopSec"))
            self.assertEqual(proc.wait(timeout=stop), 0, self.log(log))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            notify.close()

    def printed(self, log, prefix):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for line in self.log(log).splitlines():
                if line.startswith(prefix):
                    return line[len(prefix):].strip()
            time.sleep(0.05)
        self.fail("no '%s' line:\n%s" % (prefix, self.log(log)))

    @staticmethod
    def log(log):
        with open(log) as f:
            return f.read()


if __name__ == "__main__":
    lib.main()
