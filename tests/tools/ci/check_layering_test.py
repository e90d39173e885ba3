"""Tests of tools/ci/check_layering.py on small synthetic trees: a clean tree
passes; an upward include, an include across one floor, an include of
generated protos from a low floor, an include between daemons and an include
of tests/ from a library each fail, reported with their file and line."""

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import unittest


def _repo_root():
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:
        return os.path.join(srcdir, os.environ.get("TEST_WORKSPACE", "mneme"))
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))


sys.path.insert(0, os.path.join(_repo_root(), "tools", "ci"))
sys.path.insert(0, os.path.join(_repo_root(), "tests", "testing"))
import check_layering  # noqa: E402
from junit_runner import main  # noqa: E402

# A tree that keeps every rule: each floor includes only from below (and
# tests/ from anywhere).
CLEAN_TREE = {
    "common/status.h": "#pragma once\n#include <vector>\n"
                       '#include "absl/status/status.h"\n',
    "formats/e4m3.h": '#pragma once\n#include "common/status.h"\n',
    "checkpoint/reader.h": '#include "formats/e4m3.h"\n'
                           '#include "common/status.h"\n',
    "text/tokenizer.h": '#include "common/status.h"\n',
    "engram_store/io/reader.h": '#include "checkpoint/reader.h"\n'
                                '#include "text/tokenizer.h"\n'
                                '#include "engram_store/cache/cache.h"\n'
                                '#include "proto/engram/v1/engram.pb.h"\n',
    "engram_store/cache/cache.h": '#include "formats/e4m3.h"\n',
    "gpu/backend.h": '#include "formats/e4m3.h"\n',
    "gpu/comm/comm.cc": '#include "gpu/backend.h"\n'
                        '#include "comm.h"\n',
    "model/model.cc": '#include "gpu/backend.h"\n'
                      '#include "engram_store/io/reader.h"\n',
    "services/common/daemon.h": '#include "common/status.h"\n',
    "services/worker/main.cc": '#include "services/common/daemon.h"\n'
                               '#include "services/worker/handler.h"\n'
                               '#include "model/model.cc"\n',
    "services/worker/handler.h": "#pragma once\n",
    "tools/cli/run.cc": '#include "services/worker/handler.h"\n'
                        '#include "model/model.cc"\n',
    "tests/formats/e4m3_test.cc": '#include "tools/cli/run.cc"\n'
                                  '#include "tests/testing/util.h"\n',
    "tests/testing/util.h": "#pragma once\n",
}


class CheckLayeringTest(unittest.TestCase):

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="layering_")
        self.addCleanup(shutil.rmtree, self.root)

    def write_tree(self, files):
        for rel, text in files.items():
            path = os.path.join(self.root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)

    def run_checker(self):
        """(exit status, printed lines) of the checker's main on the tree."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = check_layering.main(["check_layering.py", self.root])
        return rc, out.getvalue().splitlines()

    def with_change(self, rel, text):
        tree = dict(CLEAN_TREE)
        tree[rel] = text
        self.write_tree(tree)
        return self.run_checker()

    def test_clean_tree_passes(self):
        self.write_tree(CLEAN_TREE)
        rc, lines = self.run_checker()
        self.assertEqual(rc, 0, lines)
        self.assertEqual(len(lines), 1)
        self.assertIn("no include runs upward", lines[0])

    def test_upward_include_fails_with_file_and_line(self):
        rc, lines = self.with_change(
            "formats/x.h",
            '#pragma once\n#include <vector>\n#include "model/y.h"\n')
        self.assertEqual(rc, 1)
        self.assertEqual(len(lines), 2, lines)
        self.assertTrue(lines[0].startswith('formats/x.h:3: #include "model/y.h"'),
                        lines[0])
        self.assertIn("upward", lines[0])
        self.assertIn("1 include(s)", lines[1])

    def test_same_floor_cross_include_fails(self):
        rc, lines = self.with_change(
            "checkpoint/reader.h",
            '#include "formats/e4m3.h"\n#include "text/tokenizer.h"\n')
        self.assertEqual(rc, 1)
        self.assertTrue(
            lines[0].startswith('checkpoint/reader.h:2: #include '
                                '"text/tokenizer.h"'), lines[0])
        self.assertIn("share floor 3", lines[0])

    def test_engram_store_and_gpu_may_not_include_each_other(self):
        rc, lines = self.with_change("gpu/backend.h",
                                     '#include "engram_store/cache/cache.h"\n')
        self.assertEqual(rc, 1)
        self.assertTrue(lines[0].startswith("gpu/backend.h:1:"), lines[0])
        self.assertIn("share floor 4", lines[0])

    def test_library_including_services_fails(self):
        rc, lines = self.with_change(
            "gpu/comm/comm.cc",
            '#include "gpu/backend.h"\n#include "services/common/daemon.h"\n')
        self.assertEqual(rc, 1)
        self.assertTrue(lines[0].startswith("gpu/comm/comm.cc:2:"), lines[0])
        self.assertIn("upward", lines[0])

    def test_proto_headers_only_from_floor_four_up(self):
        rc, lines = self.with_change(
            "text/tokenizer.h", '#include "proto/worker/v1/worker.pb.h"\n')
        self.assertEqual(rc, 1)
        self.assertTrue(lines[0].startswith("text/tokenizer.h:1:"), lines[0])
        self.assertIn("proto", lines[0])

    def test_services_common_may_not_include_a_daemon(self):
        rc, lines = self.with_change(
            "services/common/daemon.h", '#include "services/worker/handler.h"\n')
        self.assertEqual(rc, 1)
        self.assertTrue(lines[0].startswith("services/common/daemon.h:1:"),
                        lines[0])

    def test_daemons_may_not_include_each_other(self):
        rc, lines = self.with_change(
            "services/coordinator/engine.cc",
            '#include "services/common/daemon.h"\n'
            '#include "services/worker/handler.h"\n')
        self.assertEqual(rc, 1)
        self.assertTrue(lines[0].startswith("services/coordinator/engine.cc:2:"),
                        lines[0])
        self.assertIn("separate daemons", lines[0])

    def test_only_tests_include_tests(self):
        rc, lines = self.with_change("model/model.cc",
                                     '#include "tests/testing/util.h"\n')
        self.assertEqual(rc, 1)
        self.assertTrue(lines[0].startswith("model/model.cc:1:"), lines[0])

    def test_folder_without_a_floor_is_reported(self):
        rc, lines = self.with_change("newdir/thing.cc", "int x;\n")
        self.assertEqual(rc, 1)
        self.assertTrue(lines[0].startswith("newdir/thing.cc:1:"), lines[0])
        self.assertIn("no floor", lines[0])

    def test_every_violation_is_listed(self):
        tree = dict(CLEAN_TREE)
        tree["formats/x.h"] = '#include "model/y.h"\n'
        tree["common/y.h"] = '\n#include "formats/e4m3.h"\n'
        self.write_tree(tree)
        rc, lines = self.run_checker()
        self.assertEqual(rc, 1)
        self.assertEqual(sorted(l.split(" ")[0] for l in lines[:-1]),
                         ["common/y.h:2:", "formats/x.h:1:"])

    def test_git_tree_checks_new_files_but_not_ignored_ones(self):
        if shutil.which("git") is None:
            self.skipTest("no git")
        tree = dict(CLEAN_TREE)
        tree[".gitignore"] = "formats/ignored.h\n"
        tree["formats/deleted.h"] = "#pragma once\n"
        self.write_tree(tree)
        env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", HOME=self.root)
        subprocess.run(["git", "init", "-q", self.root], check=True, env=env)
        subprocess.run(["git", "-C", self.root, "add", "."], check=True, env=env)
        # Tracked but deleted from the work tree, and ignored: not checked.
        os.remove(os.path.join(self.root, "formats/deleted.h"))
        self.write_tree({"formats/ignored.h": '#include "model/y.h"\n'})
        rc, lines = self.run_checker()
        self.assertEqual(rc, 0, lines)
        # New and not ignored: checked before it is added.
        self.write_tree({"formats/new.h": '#include "model/y.h"\n'})
        rc, lines = self.run_checker()
        self.assertEqual(rc, 1)
        self.assertEqual(len(lines), 2, lines)
        self.assertTrue(lines[0].startswith("formats/new.h:1:"), lines[0])

if __name__ == "__main__":
    main()
