"""The reference configuration in deploy/config loads in the daemons' config
loader: for every node, each service's command line as its unit builds it
(ExecStart + the node's env files + the flagfile) passes the daemon's
--check_config, and every flagfile under deploy/config is covered. The
four nodes agree with each other, and the values are the reference
topology's (TP 4, DCP 4, 8192-token chunks, 6 GiB KV per rank, 500K context,
local copy with NFS fallback, NCCL over RoCE).
"""

import glob
import os
import unittest

import deploy_lib as lib

CONFIG_ROOT = lib.path("deploy", "config")
SPARK = os.path.join(CONFIG_ROOT, "spark-4x")
SYSTEMD_DIR = lib.path("deploy", "systemd")
NODES = ["spark-0", "spark-1", "spark-2", "spark-3"]


def node_command(config_dir, node, service, unset=()):
    """(argv without the binary, env) of the service on the node, as its unit
    builds them (with the variables in `unset` left out of the env files);
    None when the node does not run the service."""
    if not os.path.exists(os.path.join(config_dir, "nodes", node,
                                       service + ".env")):
        return None
    unit = lib.Unit(os.path.join(SYSTEMD_DIR, service + ".service"))
    env = {}
    for env_file in unit.all("Service", "EnvironmentFile"):
        name = os.path.basename(env_file)
        local = os.path.join(config_dir, name)
        if not os.path.exists(local):
            local = os.path.join(config_dir, "nodes", node, name)
        env.update(lib.parse_env_file(local))
    for name in unset:
        del env[name]
    argv, _ = lib.expand_exec(unit.get("Service", "ExecStart"), env)
    flagfiles = {"/etc/mneme/%s.flags" % service:
                 os.path.join(config_dir, service + ".flags")}
    args = []
    for a in argv[1:]:
        if a.startswith("--flagfile="):
            a = "--flagfile=" + flagfiles[a[len("--flagfile="):]]
        args.append(a)
    return args, env


class CheckConfigTest(unittest.TestCase):

    def test_every_node_command_line_passes_check_config(self):
        checked = set()
        for config_dir in sorted(glob.glob(os.path.join(CONFIG_ROOT, "*/"))):
            for node in sorted(os.listdir(os.path.join(config_dir, "nodes"))):
                for service, daemon in lib.UNIT_DAEMONS.items():
                    cmd = node_command(config_dir, node, service)
                    if cmd is None:
                        continue
                    args, env = cmd
                    with self.subTest(config=config_dir, node=node,
                                      service=service):
                        r = lib.check_config(daemon, args, env)
                        self.assertEqual(r.returncode, 0, r.stderr)
                        self.assertEqual(r.stdout, "%s: config ok\n" % daemon)
                        checked.add(os.path.realpath(os.path.join(
                            config_dir, service + ".flags")))
        every = {os.path.realpath(p) for p in glob.glob(
            os.path.join(CONFIG_ROOT, "**", "*.flags"), recursive=True)}
        self.assertTrue(every)
        self.assertEqual(every - checked, set(), "flagfiles no node uses")

    def test_check_config_rejects_what_the_daemons_reject(self):
        # The check above is live: a bad value, an unknown flag and a node
        # without its rank all fail with one clear line.
        args, env = node_command(SPARK, "spark-1", "mneme-worker")
        r = lib.check_config("mneme_worker", args + ["--kv_cache_bytes=0"],
                             env)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--kv_cache_bytes", r.stderr)
        r = lib.check_config("mneme_worker", args + ["--kv_cache_byte=1"], env)
        self.assertEqual(r.returncode, 1)
        self.assertIn("kv_cache_byte", r.stderr)
        # Without MNEME_RANKS the unit passes --ranks= and the store refuses
        # to start, rather than serving rank 0's rows on this node.
        args, env = node_command(SPARK, "spark-2", "mneme-engram-store",
                                 unset=["MNEME_RANKS"])
        self.assertIn("--ranks=", args)
        r = lib.check_config("mneme_engram_store", args, env)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--ranks", r.stderr)
        args, env = node_command(SPARK, "spark-2", "mneme-worker",
                                 unset=["MNEME_RANK"])
        r = lib.check_config("mneme_worker", args, env)
        self.assertEqual(r.returncode, 1)
        self.assertIn("flag 'rank'", r.stderr)


class ReferenceTopologyTest(unittest.TestCase):

    def flags(self, node, service):
        args, _ = node_command(SPARK, node, service)
        return lib.effective_flags(args)

    def test_reference_values(self):
        for node in NODES:
            store = self.flags(node, "mneme-engram-store")
            worker = self.flags(node, "mneme-worker")
            with self.subTest(node=node):
                self.assertEqual(worker["tp_size"], "4")
                self.assertEqual(worker["dcp_size"], "4")
                self.assertEqual(worker["backend"], "cuda")
                self.assertEqual(worker["device"], "0")
                self.assertEqual(worker["kv_cache_bytes"], str(6 << 30))
                self.assertEqual(worker["max_step_tokens"], "8192")
                self.assertEqual(store["tp_size"], "4")
                self.assertEqual(store["checkpoint"], worker["checkpoint"])
                self.assertTrue(store["checkpoint"].startswith("/mnt/"))
                self.assertEqual(store["source_open_mode"], "nfs")
                self.assertEqual(store["local_copy_dir"],
                                 "/var/lib/mneme/local")
                self.assertEqual(store["column_split"], "strided")
        coordinator = self.flags("spark-0", "mneme-coordinator")
        self.assertEqual(coordinator["max_num_batched_tokens"], "8192")
        self.assertEqual(coordinator["max_context_tokens"], "524288")

    def test_public_ports_need_the_api_key(self):
        # The coordinator's Serving API listens on every interface: its
        # callers need the API key, a file beside the cluster secret
        # (docs/DEPLOY.md, "The API key"). The HTTP API, when a node turns it
        # on, takes the same key.
        coordinator = self.flags("spark-0", "mneme-coordinator")
        self.assertEqual(lib.host_port(coordinator["listen"])[0], "0.0.0.0")
        key_file = coordinator.get("http_api_key_file", "")
        self.assertEqual(key_file, "/etc/mneme-secret/api_key")
        self.assertEqual(os.path.dirname(key_file), os.path.dirname(
            coordinator["cluster_secret_file"]))
        # Only the coordinator has a public port: the other daemons do not
        # read the key.
        for node in NODES:
            for service in ("mneme-engram-store", "mneme-worker"):
                with self.subTest(node=node, service=service):
                    self.assertNotIn("http_api_key_file",
                                     self.flags(node, service))

    def test_nodes_agree(self):
        ports = lib.daemon_ports()
        listens = {}
        for node in NODES:
            store = self.flags(node, "mneme-engram-store")
            worker = self.flags(node, "mneme-worker")
            with self.subTest(node=node):
                rank = int(worker["rank"])
                # The store serves the rank of the worker beside it.
                self.assertEqual(store["ranks"], worker["rank"])
                self.assertNotIn(rank, listens)
                listens[rank] = worker["listen"]
                host, port = lib.host_port(worker["listen"])
                self.assertEqual(port, ports["mneme_worker"][0])
                self.assertEqual(worker["comm_host"], host)
                # The metrics and health ports have no authentication:
                # loopback only (docs/DEPLOY.md).
                self.assertEqual(lib.host_port(worker["metrics_listen"]),
                                 ("127.0.0.1", ports["mneme_worker"][1]))
                # The worker reaches the store of its own node.
                self.assertEqual(worker["engram_store"], store["listen"])
                self.assertEqual(lib.host_port(store["listen"])[1],
                                 ports["mneme_engram_store"][0])
                self.assertEqual(lib.host_port(store["metrics_listen"]),
                                 ("127.0.0.1", ports["mneme_engram_store"][1]))
        self.assertEqual(sorted(listens), list(range(4)))
        for node in NODES:
            self.assertEqual(self.flags(node, "mneme-worker")["group"],
                             listens[0])
        coordinators = [n for n in NODES if node_command(
            SPARK, n, "mneme-coordinator")]
        self.assertEqual(coordinators, ["spark-0"])
        coordinator = self.flags("spark-0", "mneme-coordinator")
        self.assertEqual(coordinator["workers"].split(","),
                         [listens[r] for r in range(4)])
        self.assertEqual(lib.host_port(coordinator["listen"])[1],
                         ports["mneme_coordinator"][0])
        self.assertEqual(lib.host_port(coordinator["metrics_listen"]),
                         ("127.0.0.1", ports["mneme_coordinator"][1]))
        worker = self.flags("spark-0", "mneme-worker")
        self.assertGreaterEqual(int(worker["max_step_tokens"]),
                                int(coordinator["max_num_batched_tokens"]))

    def test_nccl_over_roce(self):
        env = lib.parse_env_file(os.path.join(SPARK, "nccl.env"))
        self.assertTrue(env["NCCL_IB_HCA"])
        self.assertEqual(env["NCCL_IB_GID_INDEX"], "3")
        self.assertTrue(env["NCCL_SOCKET_IFNAME"])
        # Smaller than NCCL's 4 MiB default: less pinned host memory.
        self.assertLess(int(env["NCCL_BUFFSIZE"]), 4 << 20)


if __name__ == "__main__":
    lib.main()
