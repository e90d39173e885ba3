#!/usr/bin/env python3
"""Sets each Bazel package's visibility from its floor (docs/ARCHITECTURE.md).

A package of floor N becomes visible to `//:floorN_users` (the packages
above floor N and the tests: the package_groups of the root BUILD.bazel) and
to its own folder:

    common/...                 //:floor1_users, //common:__subpackages__
    formats/...                //:floor2_users, //formats:__subpackages__
    checkpoint/..., text/...   //:floor3_users, //<folder>:__subpackages__
    engram_store/..., gpu/...  //:floor4_users, //<folder>:__subpackages__
    model/...                  //:floor5_users, //model:__subpackages__
    services/common/...        //:floor6_users, //services:__subpackages__
    services/<daemon>/...      //:floor6_users, //services/<daemon>:__subpackages__
    tools/...                  //:floor7_users, //tools:__subpackages__
    proto/...                  //:proto_users

What is rewritten: a `package(default_visibility = ["//visibility:public"])`
(or no package() call at all) becomes `package(default_visibility = [...])`
with that list, and every target's `visibility = ["//visibility:public"]`
becomes the same list. Narrower lists somebody wrote on purpose (private
defaults, `//tests/...:__pkg__`) are kept as they are. tests/, deploy/,
docs/ and third_party/ are not touched.

usage:
  apply_visibility.py            show what would change (a diff); no writes
  apply_visibility.py --write    rewrite the BUILD files
  apply_visibility.py --check    list the dependencies in BUILD files that
                                 the new visibility would refuse (a static
                                 reading of the labels; bazel build --nobuild
                                 //... is the real check)
Exit status: 1 when --check finds a refused dependency, 0 otherwise.
"""

import argparse
import difflib
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The floors are defined once, by the layering check.
from check_layering import FLOORS  # noqa: E402
from check_layering import SERVICE_DAEMONS  # noqa: E402
PUBLIC = "//visibility:public"


def visibility_for(package):
    """The visibility list of `package` ("gpu/comm"), or None if untouched."""
    parts = package.split("/")
    top = parts[0]
    if top == "proto":
        return ["//:proto_users"]
    floor = FLOORS.get(top)
    if floor is None:
        return None
    own = "//%s:__subpackages__" % top
    if top == "services" and len(parts) > 1 and parts[1] in SERVICE_DAEMONS:
        own = "//services/%s:__subpackages__" % parts[1]
    return ["//:floor%d_users" % floor, own]


def build_files(root):
    """BUILD files of the tree: git's list (tracked and new, not ignored), or
    a walk of the directory when it is not a git work tree."""
    if not os.path.exists(os.path.join(root, ".git")):
        found = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames
                           if not d.startswith((".", "bazel-"))]
            found += [os.path.relpath(os.path.join(dirpath, n), root)
                      for n in filenames if n in ("BUILD.bazel", "BUILD")]
        return sorted(found)
    out = subprocess.run(
        ["git", "-C", root, "ls-files", "-z", "--cached", "--others",
         "--exclude-standard", "--", "*BUILD.bazel", "*BUILD"],
        check=True, stdout=subprocess.PIPE).stdout.decode()
    return sorted({p for p in out.split("\0")
                   if p and os.path.isfile(os.path.join(root, p))})


def _list_text(items, indent):
    inner = " " * (indent + 4)
    return "[\n" + "".join('%s"%s",\n' % (inner, i) for i in items) + \
        " " * indent + "]"


_PACKAGE_PUBLIC_RE = re.compile(
    r'(package\((?:[^()]*?\s)?default_visibility\s*=\s*)'
    r'\[\s*"//visibility:public"\s*,?\s*\]', re.S)
_TARGET_PUBLIC_RE = re.compile(
    r'^(?P<indent>[ \t]+)visibility\s*=\s*\[\s*"//visibility:public"\s*,?\s*\]',
    re.M)
_PACKAGE_RE = re.compile(r"^package\(", re.M)
_LOAD_RE = re.compile(r"^load\([^)]*\)\s*\n", re.M)


def rewrite(text, visibility):
    """The BUILD file text with `visibility` applied (see the module doc)."""
    if _PACKAGE_RE.search(text):
        text = _PACKAGE_PUBLIC_RE.sub(
            lambda m: m.group(1) + _list_text(visibility, 0), text)
    else:
        # After the load() lines and the blank lines that follow them.
        loads = list(_LOAD_RE.finditer(text))
        at = loads[-1].end() if loads else 0
        while text.startswith("\n", at):
            at += 1
        package = "package(default_visibility = %s)\n\n" % _list_text(
            visibility, 0)
        if at and not text[:at].endswith("\n\n"):
            package = "\n" + package
        text = text[:at] + package + text[at:]
    return _TARGET_PUBLIC_RE.sub(
        lambda m: "%svisibility = %s" % (
            m.group("indent"), _list_text(visibility, len(m.group("indent")))),
        text)


# ---------------------------------------------------------------------------
# --check: a static reading of deps against the new visibility.


def package_groups(root):
    """name -> list of package patterns, from the root BUILD.bazel."""
    with open(os.path.join(root, "BUILD.bazel")) as f:
        text = f.read()
    groups = {}
    for m in re.finditer(r"package_group\((.*?)\n\)", text, re.S):
        name = re.search(r'name\s*=\s*"([^"]+)"', m.group(1)).group(1)
        packages = re.search(r"packages\s*=\s*\[(.*?)\]", m.group(1), re.S)
        groups[name] = re.findall(r'"([^"]+)"', packages.group(1))
    return groups


def _pattern_matches(pattern, package):
    pattern = pattern.lstrip("/")
    if pattern.endswith("/..."):
        base = pattern[:-4]
        return package == base or package.startswith(base + "/")
    return package == pattern


def visible(label_list, target_pkg, user_pkg, groups):
    if user_pkg == target_pkg:
        return True
    for entry in label_list:
        if entry == PUBLIC:
            return True
        if entry == "//visibility:private":
            continue
        pkg, _, name = entry.lstrip("/").partition(":")
        if entry.startswith(":") and name in ("__pkg__", "__subpackages__"):
            pkg = target_pkg
        if name == "__pkg__" and user_pkg == pkg:
            return True
        if name == "__subpackages__" and (
                user_pkg == pkg or user_pkg.startswith(pkg + "/")):
            return True
        if pkg == "" and name in groups:
            if any(_pattern_matches(p, user_pkg) for p in groups[name]):
                return True
    return False


_CALL_RE = re.compile(r"^([A-Za-z_][\w.]*)\((.*?)^\)", re.M | re.S)
_LIST_RE = r"\b%s\s*=\s*\[(.*?)\]"


def targets(text, package_default):
    """{name: visibility list} of the rules in one BUILD file."""
    result = {}
    for m in _CALL_RE.finditer(text):
        body = m.group(2)
        name = re.search(r'^\s*name\s*=\s*"([^"]+)"', body, re.M)
        if not name:
            continue
        vis = re.search(_LIST_RE % "visibility", body, re.S)
        result[name.group(1)] = (re.findall(r'"([^"]+)"', vis.group(1))
                                 if vis else package_default)
    return result


def package_default(text):
    m = re.search(r"package\((.*?)^\)|package\((.*?)\)\s*$", text, re.M | re.S)
    if not m:
        return ["//visibility:private"]
    body = m.group(1) or m.group(2) or ""
    vis = re.search(_LIST_RE % "default_visibility", body, re.S)
    return (re.findall(r'"([^"]+)"', vis.group(1)) if vis else
            ["//visibility:private"])


def _resolve(label, pkg):
    if label.startswith("//"):
        target_pkg, _, name = label[2:].partition(":")
        return target_pkg, name or target_pkg.rsplit("/", 1)[-1]
    if label.startswith(":"):
        return pkg, label[1:]
    return None


def check(root, texts):
    """`user -> target` lines the new visibility refuses."""
    groups = package_groups(root)
    visibility_of = {}
    for path, text in texts.items():
        pkg = os.path.dirname(path)
        visibility_of[pkg] = targets(text, package_default(text))
    refused = []
    for path, text in sorted(texts.items()):
        pkg = os.path.dirname(path)
        for attr in ("deps", "data", "srcs", "hdrs", "tools"):
            for m in re.finditer(_LIST_RE % attr, text, re.S):
                for label in re.findall(r'"((?://|:)[^"]+)"', m.group(1)):
                    resolved = _resolve(label, pkg)
                    if not resolved:
                        continue
                    target_pkg, name = resolved
                    if target_pkg == pkg or target_pkg not in visibility_of:
                        continue
                    vis = visibility_of[target_pkg].get(name)
                    if vis is None:
                        continue  # A file, or a target made by a macro.
                    if not visible(vis, target_pkg, pkg, groups):
                        refused.append("//%s -> //%s:%s (visible to %s)" % (
                            pkg, target_pkg, name, ", ".join(vis)))
    return sorted(set(refused))


def main(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv[1:])

    originals, updated = {}, {}
    for path in build_files(ROOT):
        with open(os.path.join(ROOT, path)) as f:
            text = f.read()
        originals[path] = text
        vis = visibility_for(os.path.dirname(path))
        updated[path] = rewrite(text, vis) if vis else text

    changed = [p for p in sorted(updated) if updated[p] != originals[p]]
    if args.check:
        refused = check(ROOT, updated)
        for line in refused:
            print("refused: " + line)
        print("apply_visibility: %d BUILD files would change; %d dependencies "
              "would be refused" % (len(changed), len(refused)))
        return 1 if refused else 0
    for path in changed:
        if args.write:
            with open(os.path.join(ROOT, path), "w") as f:
                f.write(updated[path])
        else:
            sys.stdout.writelines(difflib.unified_diff(
                originals[path].splitlines(True), updated[path].splitlines(True),
                "a/" + path, "b/" + path))
    print("apply_visibility: %d BUILD files %s" % (
        len(changed), "rewritten" if args.write else "would change (--write)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
