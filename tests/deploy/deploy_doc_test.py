"""docs/DEPLOY.md's "One machine, CPU backend" walkthrough, run as written:
the ```bash cpu-demo blocks, in order, as one bash script. Only the three
settings at its top change: BIN (the binaries Bazel built for this test),
DEMO (a directory under $TEST_TMPDIR) and PORT (a block of free ports). The
script must succeed (bash -e), with `mneme generate --json` printing generated
tokens, the store of node 1 having served rows from its local copy, and every
daemon exiting 0 when it is stopped.
"""

import json
import os
import re
import signal
import subprocess
import unittest

import deploy_lib as lib

DOC = lib.path("docs", "DEPLOY.md")
SECTION = "## One machine, CPU backend"
FENCE = "```bash cpu-demo"


def walkthrough():
    """The cpu-demo blocks of the section, in order."""
    with open(DOC) as f:
        text = f.read()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end >= 0 else len(text)]
    blocks = re.findall(r"^" + re.escape(FENCE) + r"\n(.*?)^```$", section,
                        re.M | re.S)
    return blocks


class DeployDocTest(unittest.TestCase):

    def test_cpu_walkthrough_works_as_written(self):
        blocks = walkthrough()
        self.assertGreaterEqual(len(blocks), 5)
        script = "\n".join(blocks)
        # The ports the walkthrough uses: node N at PORT + 100 N + 151, 152,
        # 161, 162; the coordinator at PORT + 171, 172.
        offsets = [100 * n + o for n in range(4) for o in (151, 152, 161, 162)]
        offsets += [171, 172]
        port = lib.free_port_block(offsets)
        demo = os.path.join(lib.tmpdir("walkthrough"), "mneme-demo")
        substitutions = [
            ("BIN=$PWD/bazel-bin\n", "BIN=%s\n" % lib.root()),
            ("DEMO=/tmp/mneme-demo\n", "DEMO=%s\n" % demo),
            ("PORT=50000\n", "PORT=%d\n" % port),
        ]
        for old, new in substitutions:
            self.assertEqual(script.count(old), 1, old)
            script = script.replace(old, new)

        proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", script],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, cwd=lib.root())
        try:
            out, err = proc.communicate(timeout=180)
        finally:
            # Nothing the walkthrough started outlives the test.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        logs = self.logs(demo)
        self.assertEqual(proc.returncode, 0,
                         "stdout:\n%s\nstderr:\n%s\n%s" % (out, err, logs))

        generated = [json.loads(line) for line in out.splitlines()
                     if line.startswith("{")]
        self.assertEqual(len(generated), 1, out)
        self.assertEqual(len(generated[0]["token_ids"]), 8, out)
        self.assertEqual(generated[0]["prompt_tokens"], 4)
        local = re.search(
            r'^mneme_engram_rows_served_total\{tier="local"\} (\d+)$', out,
            re.M)
        self.assertIsNotNone(local, out)
        self.assertGreater(int(local.group(1)), 0)
        # The walkthrough waited for every daemon: each exited 0 on SIGTERM
        # (under `set -e` another status fails the script).
        with open(os.path.join(demo, "pids")) as f:
            self.assertEqual(len(f.read().split()), 9)

    @staticmethod
    def logs(demo):
        d = os.path.join(demo, "logs")
        if not os.path.isdir(d):
            return ""
        parts = []
        for name in sorted(os.listdir(d)):
            with open(os.path.join(d, name)) as f:
                parts.append("== %s\n%s" % (name, f.read()[-3000:]))
        return "\n".join(parts)


if __name__ == "__main__":
    lib.main()
