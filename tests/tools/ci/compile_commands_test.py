"""Tests of how tools/ci/compile_commands.py finds the CUDA toolkit's headers:
from $CUDA_PATH / $CUDA_HOME as the Bazel repository rule does, never from the
directory beside an nvcc wrapper script on PATH, and not at all when no
directory holds cuda_runtime.h."""

import os
import stat
import sys
import tempfile
import unittest
from unittest import mock


def _repo_root():
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:
        return os.path.join(srcdir, os.environ.get("TEST_WORKSPACE", "mneme"))
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))


sys.path.insert(0, os.path.join(_repo_root(), "tools", "ci"))
sys.path.insert(0, os.path.join(_repo_root(), "tests", "testing"))
import compile_commands  # noqa: E402
from junit_runner import main  # noqa: E402


class CudaIncludeDirTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def make_toolkit(self, name):
        root = os.path.join(self.root, name)
        os.makedirs(os.path.join(root, "include"))
        os.makedirs(os.path.join(root, "bin"))
        with open(os.path.join(root, "include", "cuda_runtime.h"), "w") as f:
            f.write("// toolkit header\n")
        return root

    def make_wrapper_bin(self, target):
        """A bin/ with an nvcc shell wrapper and an include/ beside it that
        is not a toolkit's (as /usr/local/bin and /usr/local/include)."""
        prefix = os.path.join(self.root, "prefix")
        os.makedirs(os.path.join(prefix, "bin"))
        os.makedirs(os.path.join(prefix, "include"))
        nvcc = os.path.join(prefix, "bin", "nvcc")
        with open(nvcc, "w") as f:
            f.write('#!/bin/sh\nexec %s/bin/nvcc "$@"\n' % target)
        os.chmod(nvcc, os.stat(nvcc).st_mode | stat.S_IXUSR)
        return os.path.join(prefix, "bin")

    def lookup(self, env, default_root_exists):
        real_isfile = os.path.isfile

        def isfile(path):
            # The machine's own /usr/local/cuda is hidden unless asked for.
            if path.startswith("/usr/local/cuda/") and not default_root_exists:
                return False
            return real_isfile(path)

        with mock.patch.dict(os.environ, env, clear=True), \
                mock.patch.object(os.path, "isfile", side_effect=isfile):
            return compile_commands.cuda_include_dir()

    def test_cuda_path_wins(self):
        toolkit = self.make_toolkit("cuda-x")
        found = self.lookup({"CUDA_PATH": toolkit, "PATH": "/nonexistent"},
                            default_root_exists=False)
        self.assertEqual(found, os.path.join(toolkit, "include"))

    def test_cuda_home_is_used(self):
        toolkit = self.make_toolkit("cuda-y")
        found = self.lookup({"CUDA_HOME": toolkit, "PATH": "/nonexistent"},
                            default_root_exists=False)
        self.assertEqual(found, os.path.join(toolkit, "include"))

    def test_wrapper_on_path_is_not_taken_for_a_toolkit(self):
        # The wrapper's sibling include/ has no cuda_runtime.h: no toolkit.
        wrapper_bin = self.make_wrapper_bin(os.path.join(self.root, "none"))
        found = self.lookup({"PATH": wrapper_bin}, default_root_exists=False)
        self.assertIsNone(found)

    def test_real_nvcc_on_path_is_used(self):
        toolkit = self.make_toolkit("cuda-z")
        nvcc = os.path.join(toolkit, "bin", "nvcc")
        with open(nvcc, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(nvcc, os.stat(nvcc).st_mode | stat.S_IXUSR)
        found = self.lookup({"PATH": os.path.join(toolkit, "bin")},
                            default_root_exists=False)
        self.assertEqual(found, os.path.join(toolkit, "include"))

    def test_empty_variables_are_ignored(self):
        toolkit = self.make_toolkit("cuda-w")
        found = self.lookup({"CUDA_PATH": "", "CUDA_HOME": toolkit,
                             "PATH": "/nonexistent"},
                            default_root_exists=False)
        self.assertEqual(found, os.path.join(toolkit, "include"))


if __name__ == "__main__":
    main()
