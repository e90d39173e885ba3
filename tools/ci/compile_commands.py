#!/usr/bin/env python3
"""Writes compile_commands.json for every .cc file of the tree (tracked, or
new and not ignored), with the flags the
Bazel build uses, so that clang-tidy (tools/ci/check_tidy.sh) and editors
(clangd) can parse the tree. Bazel 4 has no compile-database output, so the
flags are rebuilt here:

  -std=c++20 -Wall -Wextra     as in .bazelrc
  -I.                          the workspace root (every include is
                               workspace-relative: "common/status_macros.h")
  -Ibazel-bin                  the generated proto/**/*.pb.h headers (build
                               them first: bazel build //proto/...)
  pkg-config --cflags ...      the system libraries that WORKSPACE's
                               system_libs() exposes as @sys//:<name>

Sources that need the CUDA toolkit (they include <cuda_runtime.h>, <nccl.h>
...: the --config=cuda side of a select()) are listed only when a toolkit is
installed; the others are the CPU build's sources.

usage: compile_commands.py [-o OUTPUT]   (default: ./compile_commands.json)
"""

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# The compiler driver clang-tidy emulates: clang++ with Debian's libstdc++.
COMPILER = "clang++"

# Flags of .bazelrc's `build` lines (minus -Werror and the optimization
# level, which do not change what is parsed).
BAZELRC_FLAGS = ["-std=c++20", "-Wall", "-Wextra"]

CUDA_INCLUDE_RE = re.compile(
    r"^\s*#\s*include\s*<(cuda[\w/]*|cublas\w*|nccl|curand\w*)\.h>", re.M)


def workspace_pkg_config_modules(workspace_text):
    """The pkg-config modules named in the `libraries = {...}` of system_libs."""
    m = re.search(r"system_libs\((.*?)\n\)", workspace_text, re.S)
    if not m:
        raise SystemExit("compile_commands: no system_libs(...) in WORKSPACE")
    body = m.group(1)
    libs = re.search(r"\blibraries\s*=\s*\{(.*?)\n    \}", body, re.S)
    if not libs:
        raise SystemExit("compile_commands: no libraries = {...} in WORKSPACE")
    modules = []
    for values in re.findall(r":\s*\[([^\]]*)\]", libs.group(1)):
        modules += re.findall(r'"([^"]+)"', values)
    return modules


def pkg_config_cflags(modules):
    out = subprocess.run(["pkg-config", "--cflags"] + modules, check=True,
                         stdout=subprocess.PIPE).stdout.decode()
    return shlex.split(out)


def cuda_include_dir():
    """The CUDA toolkit's include directory, or None when none is installed.

    Looks where third_party/build_defs/cuda_configure.bzl looks ($CUDA_PATH,
    $CUDA_HOME, /usr/local/cuda), then beside the nvcc on PATH; a directory
    counts only when it holds cuda_runtime.h (an nvcc on PATH may be a wrapper
    script in /usr/local/bin, whose sibling include/ is not the toolkit's).
    """
    roots = [os.environ[v] for v in ("CUDA_PATH", "CUDA_HOME")
             if os.environ.get(v)]
    roots.append("/usr/local/cuda")
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    for root in roots:
        include = os.path.join(root, "include")
        if os.path.isfile(os.path.join(include, "cuda_runtime.h")):
            return include
    return None


def tracked_cc_files(root):
    """The .cc files git tracks plus new ones it does not ignore, less those
    deleted from the work tree."""
    out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached",
                          "--others", "--exclude-standard", "--", "*.cc"],
                         check=True, stdout=subprocess.PIPE).stdout.decode()
    return sorted({p for p in out.split("\0")
                   if p and os.path.isfile(os.path.join(root, p))})


def needs_cuda(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return bool(CUDA_INCLUDE_RE.search(f.read()))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-o", "--output",
                        default=os.path.join(ROOT, "compile_commands.json"))
    args = parser.parse_args(argv[1:])

    with open(os.path.join(ROOT, "WORKSPACE")) as f:
        modules = workspace_pkg_config_modules(f.read())
    flags = BAZELRC_FLAGS + ["-I.", "-Ibazel-bin"] + pkg_config_cflags(modules)
    cuda = cuda_include_dir()
    if not os.path.isdir(os.path.join(ROOT, "bazel-bin", "proto")):
        print("compile_commands: bazel-bin/proto is missing: the *.pb.h "
              "headers will not be found (run bazel build //proto/... first)",
              file=sys.stderr)

    entries = []
    skipped = []
    for rel in tracked_cc_files(ROOT):
        file_flags = flags
        if needs_cuda(os.path.join(ROOT, rel)):
            if cuda is None:
                skipped.append(rel)
                continue
            file_flags = flags + ["-I" + cuda]
        entries.append({
            "directory": ROOT,
            "file": rel,
            "arguments": [COMPILER] + file_flags + ["-c", rel],
        })
    with open(args.output, "w") as f:
        json.dump(entries, f, indent=1)
        f.write("\n")
    note = ""
    if skipped:
        note = " (no CUDA toolkit: left out %s)" % ", ".join(skipped)
    print("compile_commands: %d files -> %s%s" % (len(entries), args.output,
                                                   note))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
