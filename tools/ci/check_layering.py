#!/usr/bin/env python3
"""Fails when a C++ file includes from a floor it may not depend on.

The tree is built in floors (docs/ARCHITECTURE.md). A file may include from
its own folder and from any lower floor, never from a higher floor and never
from another folder of its own floor:

    floor 1  common/
    floor 2  formats/
    floor 3  checkpoint/  text/          (not each other)
    floor 4  engram_store/  gpu/         (not each other)
    floor 5  model/
    floor 6  services/
    floor 7  tools/

Also:
  - proto/ (the generated *.pb.h headers) may be included from floor 4 up.
  - tests/ may include anything; only tests/ may include tests/.
  - Inside services/: services/common may not include services/{engram,
    worker,coordinator}, and those three may not include each other.
  - A tracked C++ file in a top-level folder with no floor is reported, so a
    new folder gets a floor before it gets code.

Only `#include "..."` (and `#include <...>` whose first path component is a
folder of this repository) are checked; library headers ("absl/...",
<vector>) are not ours.

usage: check_layering.py [ROOT]    (default: the repository of this script)
Checks the files git tracks plus new files it does not ignore.
Prints `file:line: ...` for every violation; exit status 1 if any.
"""

import os
import re
import subprocess
import sys

# Top-level folder -> floor.
FLOORS = {
    "common": 1,
    "formats": 2,
    "checkpoint": 3,
    "text": 3,
    "engram_store": 4,
    "gpu": 4,
    "model": 5,
    "services": 6,
    "tools": 7,
}

# Generated headers (proto/**.pb.h): usable from this floor up.
PROTO_MIN_FLOOR = 4

# Folders whose files may include anything.
UNRESTRICTED = ("tests",)

# Folders with C++ that is not ours (no floor, may include anything).
EXTERNAL = ("third_party",)

# services/<sub> folders that are separate daemons: none may include another,
# and services/common may include none of them.
SERVICE_DAEMONS = ("engram", "worker", "coordinator")

SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh")

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def tracked_sources(root):
    """C++ files of the git work tree at root (relative paths): tracked ones
    and new ones git does not ignore, less those deleted from the tree."""
    out = subprocess.run(
        ["git", "-C", root, "ls-files", "-z", "--cached", "--others",
         "--exclude-standard", "--"] + ["*" + s for s in SOURCE_SUFFIXES],
        check=True, stdout=subprocess.PIPE).stdout.decode()
    return sorted({p for p in out.split("\0")
                   if p and os.path.isfile(os.path.join(root, p))})


def walk_sources(root):
    """C++ files under root (relative paths); for trees that are not git."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames
                       if not d.startswith(".") and not d.startswith("bazel-")]
        for name in filenames:
            if name.endswith(SOURCE_SUFFIXES):
                found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(p.replace(os.sep, "/") for p in found)


def includes(path):
    """(line_number, bracket, included_path) for each #include in path."""
    result = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            m = _INCLUDE_RE.match(line)
            if m:
                result.append((number, m.group(1), m.group(2).strip()))
    return result


def _top(path):
    return path.split("/", 1)[0]


def _second(path):
    parts = path.split("/")
    return parts[1] if len(parts) > 2 else ""


def violation(source, target):
    """Why source may not include target (both repository paths), or None."""
    src_top, dst_top = _top(source), _top(target)
    if src_top in UNRESTRICTED or src_top in EXTERNAL:
        return None
    if dst_top in UNRESTRICTED:
        return "only %s/ may include %s/" % (dst_top, dst_top)
    src_floor = FLOORS.get(src_top)
    if src_floor is None:
        return None  # Reported once per file by check().
    if dst_top == "proto":
        if src_floor < PROTO_MIN_FLOOR:
            return ("%s/ (floor %d) may not include generated proto headers "
                    "(floor %d and up)" % (src_top, src_floor, PROTO_MIN_FLOOR))
        return None
    dst_floor = FLOORS.get(dst_top)
    if dst_floor is None:
        return None  # Not one of our floors (third_party/ and the like).
    if dst_floor > src_floor:
        return "%s/ (floor %d) includes upward from %s/ (floor %d)" % (
            src_top, src_floor, dst_top, dst_floor)
    if dst_floor == src_floor and dst_top != src_top:
        return "%s/ and %s/ share floor %d and may not include each other" % (
            src_top, dst_top, src_floor)
    if src_top == "services" and dst_top == "services":
        src_sub, dst_sub = _second(source), _second(target)
        if dst_sub in SERVICE_DAEMONS and src_sub != dst_sub:
            if src_sub == "common":
                return "services/common may not include services/%s" % dst_sub
            if src_sub in SERVICE_DAEMONS:
                return ("services/%s and services/%s are separate daemons and "
                        "may not include each other" % (src_sub, dst_sub))
    return None


def check(root, files):
    """List of `file:line: message` strings for the given relative paths."""
    repo_tops = set(FLOORS) | {"proto"} | set(UNRESTRICTED) | set(EXTERNAL)
    problems = []
    for rel in files:
        top = _top(rel)
        if "/" not in rel:
            top = ""
        if top in UNRESTRICTED or top in EXTERNAL:
            continue
        if top not in FLOORS:
            problems.append("%s:1: file is in a folder with no floor (add the "
                            "folder to FLOORS in tools/ci/check_layering.py)" %
                            rel)
            continue
        for number, bracket, target in includes(os.path.join(root, rel)):
            if "/" not in target:
                continue  # Same-directory include.
            if bracket == "<" and _top(target) not in repo_tops:
                continue  # A library header.
            why = violation(rel, os.path.normpath(target).replace(os.sep, "/"))
            if why:
                problems.append("%s:%d: #include %s%s%s: %s" % (
                    rel, number, bracket, target,
                    '"' if bracket == '"' else ">", why))
    return problems


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..")
    root = os.path.abspath(root)
    if os.path.isdir(os.path.join(root, ".git")) or os.path.isfile(
            os.path.join(root, ".git")):
        files = tracked_sources(root)
    else:
        files = walk_sources(root)
    problems = check(root, files)
    for p in problems:
        print(p)
    if problems:
        print("layering: %d include(s) break the floors (see "
              "docs/ARCHITECTURE.md)" % len(problems))
        return 1
    print("layering: %d files, no include runs upward or across a floor" %
          len(files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
