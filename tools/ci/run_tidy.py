#!/usr/bin/env python3
"""Runs clang-tidy over the files of a compile database, a few at a time,
counts each diagnostic once (a header's warning is reported by every file
that includes it), prints them with a count per check and per folder, and
optionally writes a report grouped by folder. Used by tools/ci/check_tidy.sh.

Results are cached per file: a file is checked again only when it, one of
the headers of ours it included last time (its `clang++ -MM` dependencies,
generated *.pb.h included), its compile command, .clang-tidy or the
clang-tidy version changed. A cold run checks every file.

usage: run_tidy.py DB_DIR [--jobs N] [--report FILE] [--cache DIR]
                   [--no-cache] [FILE.cc...]
Exit status: 0 when there is no warning or error, 1 otherwise.
"""

import argparse
import collections
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

_DIAG_RE = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?P<col>\d+): "
    r"(?P<level>warning|error): (?P<msg>.*?)(?: \[(?P<check>[\w.,-]+)\])?$")


def _sha(*parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else p.encode())
        h.update(b"\0")
    return h.hexdigest()


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def diagnostics(text):
    """(file, line, col, level, message, check) tuples in clang-tidy output."""
    found = []
    for line in text.splitlines():
        m = _DIAG_RE.match(line)
        if not m:
            continue
        path = os.path.normpath(m.group("file"))
        if os.path.isabs(path):
            path = os.path.relpath(path, ROOT)
        found.append((path, int(m.group("line")), int(m.group("col")),
                      m.group("level"), m.group("msg"),
                      m.group("check") or "clang-diagnostic-error"))
    return found


def folder(path):
    """The folder a diagnostic is reported under in the summary."""
    parts = path.split("/")
    if parts[0] in ("services", "tests", "tools", "engram_store", "gpu",
                    "model") and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0] if len(parts) > 1 else "."


def dependencies(entry):
    """Our headers (non-system) that the file includes, per clang++ -MM."""
    args = [a for a in entry["arguments"][1:] if a not in ("-c", entry["file"])]
    out = subprocess.run(
        ["clang++", "-MM", "-MG"] + args + [entry["file"]], cwd=entry["directory"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    if out.returncode != 0:
        return None
    text = out.stdout.decode().replace("\\\n", " ")
    deps = shlex.split(text.split(":", 1)[1]) if ":" in text else []
    return sorted({os.path.normpath(d) for d in deps if d != entry["file"]})


class Cache:
    """One JSON file per source: its key inputs' hash, deps and output."""

    def __init__(self, directory, config_key):
        self.directory = directory
        self.config_key = config_key
        if directory:
            os.makedirs(directory, exist_ok=True)

    def _path(self, entry):
        return os.path.join(self.directory, _sha(entry["file"]) + ".json")

    def _key(self, entry, deps):
        parts = [self.config_key, json.dumps(entry["arguments"])]
        for path in [entry["file"]] + deps:
            content = _read(os.path.join(entry["directory"], path))
            if content is None:
                return None
            parts += [path, content]
        return _sha(*parts)

    def get(self, entry):
        if not self.directory:
            return None
        data = _read(self._path(entry))
        if data is None:
            return None
        try:
            cached = json.loads(data)
        except ValueError:
            return None
        key = self._key(entry, cached.get("deps", []))
        return cached["output"] if key and key == cached.get("key") else None

    def snapshot(self, entry):
        """(deps, key) of the file as it is now: taken before clang-tidy
        reads it, so that a file edited during the run is not cached."""
        if not self.directory:
            return None
        deps = dependencies(entry)
        if deps is None:
            return None
        key = self._key(entry, deps)
        return (deps, key) if key else None

    def put(self, entry, snapshot, output):
        """Caches `output` if the file and its headers are still as they
        were at `snapshot` (nobody edited them while clang-tidy ran)."""
        if not self.directory or snapshot is None:
            return
        deps, key = snapshot
        if self._key(entry, deps) != key:
            return
        tmp = self._path(entry) + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"file": entry["file"], "key": key, "deps": deps,
                       "output": output}, f)
        os.replace(tmp, self._path(entry))


def run_one(db_dir, entry):
    out = subprocess.run(["clang-tidy", "-p", db_dir, "--quiet", entry["file"]],
                         cwd=entry["directory"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
    return out.stdout.decode(errors="replace")


def write_report(path, diags, by_check):
    grouped = collections.defaultdict(list)
    for d in diags:
        grouped[folder(d[0])].append(d)
    with open(path, "w") as f:
        f.write("clang-tidy: %d diagnostics\n\nPer check:\n" % len(diags))
        for check, n in by_check.most_common():
            f.write("  %6d  %s\n" % (n, check))
        f.write("\nPer folder:\n")
        for name in sorted(grouped):
            f.write("  %6d  %s\n" % (len(grouped[name]), name))
        for name in sorted(grouped):
            items = grouped[name]
            counts = collections.Counter(d[5] for d in items)
            f.write("\n== %s (%d: %s)\n" % (name, len(items), ", ".join(
                "%s %d" % kv for kv in counts.most_common())))
            for path_, line, col, level, msg, check in items:
                f.write("%s:%d:%d: %s: %s [%s]\n" % (path_, line, col, level,
                                                     msg, check))


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("db_dir")
    parser.add_argument("files", nargs="*")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--report")
    parser.add_argument("--cache", default=os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "mneme", "clang-tidy"))
    parser.add_argument("--no-cache", action="store_true")
    args = parser.parse_intermixed_args(argv[1:])

    with open(os.path.join(args.db_dir, "compile_commands.json")) as f:
        entries = json.load(f)
    if args.files:
        wanted = {os.path.normpath(p) for p in args.files}
        entries = [e for e in entries if e["file"] in wanted]
        missing = wanted - {e["file"] for e in entries}
        if missing:
            print("clang-tidy: not in the compile database: " +
                  ", ".join(sorted(missing)))
            return 1

    version = subprocess.run(["clang-tidy", "--version"],
                             stdout=subprocess.PIPE).stdout
    config = _read(os.path.join(ROOT, ".clang-tidy")) or b""
    cache = Cache(None if args.no_cache else args.cache,
                  _sha(version, config))

    start = time.monotonic()
    outputs = {}
    stale = []
    for e in entries:
        cached = cache.get(e)
        if cached is None:
            stale.append(e)
        else:
            outputs[e["file"]] = cached

    def work(entry):
        snapshot = cache.snapshot(entry)
        output = run_one(args.db_dir, entry)
        cache.put(entry, snapshot, output)
        return entry["file"], output

    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for name, output in pool.map(work, stale):
            outputs[name] = output

    diags = sorted({d for out in outputs.values() for d in diagnostics(out)})
    for path, line, col, level, msg, check in diags:
        print("%s:%d:%d: %s: %s [%s]" % (path, line, col, level, msg, check))
    by_check = collections.Counter(d[5] for d in diags)
    if diags:
        print("clang-tidy: per check:")
        for check, n in by_check.most_common():
            print("  %6d  %s" % (n, check))
        print("clang-tidy: per folder:")
        for name, n in sorted(collections.Counter(
                folder(d[0]) for d in diags).items()):
            print("  %6d  %s" % (n, name))
    if args.report:
        write_report(args.report, diags, by_check)
    print("clang-tidy: %d files (%d checked, %d unchanged since a cached run) "
          "in %d s: %s" % (len(entries), len(stale), len(entries) - len(stale),
                           time.monotonic() - start,
                           "%d diagnostics" % len(diags) if diags else "clean"))
    return 1 if diags else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
