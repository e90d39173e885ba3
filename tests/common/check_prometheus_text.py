"""Checks a /metrics scrape against the Prometheus text format 0.0.4.

usage: /usr/bin/python3 check_prometheus_text.py SCRAPE_FILE EXPECTED_JSON

1. Every line must match the format's grammar (HELP, TYPE, sample lines),
   each family's HELP and TYPE come once and before its samples, a family's
   samples are contiguous, and the text ends with a newline.
2. prometheus_client's parser must read it, and the families must be exactly
   the expected ones: same names, types, help and samples (name, labels,
   value; order-insensitive).
3. Histograms: per label set, buckets ascend in le, counts are cumulative,
   the last bucket is le="+Inf" and equals _count, and _sum is present.

EXPECTED_JSON: {"families": [{"name": ..., "type": ..., "help": ...,
"samples": [[sample_name, {label: value}, value], ...]}]}, written as
exported (counters by their exported name); values are numbers or the
strings "+Inf", "-Inf", "NaN".

Prints every problem to stderr and exits 1 when there is any, else exits 0.
"""

import json
import math
import re
import sys

from prometheus_client.parser import text_string_to_metric_families

METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
LABEL_VALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
LABEL = rf"{LABEL_NAME}={LABEL_VALUE}"
VALUE = r"(?:[+-]?Inf|NaN|[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
SAMPLE_RE = re.compile(
    rf"^({METRIC_NAME})(?:\{{(?:{LABEL}(?:,{LABEL})*)?\}})? {VALUE}(?: -?[0-9]+)?$")
HELP_RE = re.compile(rf"^# HELP ({METRIC_NAME})(?: (?:[^\\\n]|\\[\\n])*)?$")
TYPE_RE = re.compile(
    rf"^# TYPE ({METRIC_NAME}) (counter|gauge|histogram|summary|untyped)$")
SUFFIXES = {
    "counter": [""],
    "gauge": [""],
    "untyped": [""],
    "histogram": ["_bucket", "_sum", "_count"],
    "summary": ["", "_sum", "_count"],
}


def check_grammar(text, problems):
    if text and not text.endswith("\n"):
        problems.append("the text does not end with a newline")
    helped, typed = set(), {}
    current = None  # The family whose samples may follow.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, start=1):
        where = f"line {number} {line!r}"
        if line.startswith("# HELP "):
            match = HELP_RE.match(line)
            if not match:
                problems.append(f"{where}: malformed HELP")
                continue
            name = match.group(1)
            if name in helped:
                problems.append(f"{where}: second HELP for {name}")
            if name in typed:
                problems.append(f"{where}: HELP after TYPE for {name}")
            helped.add(name)
        elif line.startswith("# TYPE "):
            match = TYPE_RE.match(line)
            if not match:
                problems.append(f"{where}: malformed TYPE")
                continue
            name = match.group(1)
            if name in typed:
                problems.append(f"{where}: second TYPE for {name}")
            typed[name] = match.group(2)
            current = name
        elif line.startswith("#"):
            continue
        elif line == "":
            problems.append(f"{where}: empty line")
        else:
            match = SAMPLE_RE.match(line)
            if not match:
                problems.append(f"{where}: malformed sample")
                continue
            sample_name = match.group(1)
            if current is None or sample_name not in [
                    current + s for s in SUFFIXES[typed[current]]]:
                problems.append(
                    f"{where}: sample outside its family's TYPE block")


def same_value(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def sample_key(name, labels):
    return (name, tuple(sorted(labels.items())))


def check_histograms(family, problems):
    series = {}
    for sample in family.samples:
        labels = dict(sample.labels)
        le = labels.pop("le", None)
        key = tuple(sorted(labels.items()))
        entry = series.setdefault(key, {"buckets": [], "sum": None,
                                        "count": None})
        if sample.name == family.name + "_bucket":
            entry["buckets"].append((le, sample.value))
        elif sample.name == family.name + "_sum":
            entry["sum"] = sample.value
        elif sample.name == family.name + "_count":
            entry["count"] = sample.value
    for key, entry in series.items():
        where = f"histogram {family.name}{dict(key)}"
        buckets = entry["buckets"]
        if not buckets or buckets[-1][0] != "+Inf":
            problems.append(f"{where}: the last bucket is not le=\"+Inf\"")
            continue
        bounds = [float(le) for le, _ in buckets]
        if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
            problems.append(f"{where}: le bounds do not ascend: {bounds}")
        counts = [count for _, count in buckets]
        if counts != sorted(counts):
            problems.append(f"{where}: bucket counts not cumulative: {counts}")
        if entry["count"] is None or entry["count"] != counts[-1]:
            problems.append(
                f"{where}: _count {entry['count']} != +Inf bucket {counts[-1]}")
        if entry["sum"] is None:
            problems.append(f"{where}: no _sum")


def check_families(text, expected, problems):
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as error:  # The parser raises plain ValueErrors.
        problems.append(f"prometheus_client cannot parse the text: {error!r}")
        return
    parsed = {}
    for family in families:
        if family.name in parsed:
            problems.append(f"family {family.name} appears twice")
        parsed[family.name] = family

    for want in expected["families"]:
        name, typ = want["name"], want["type"]
        # prometheus_client names counter families without "_total" and their
        # samples with it.
        family_name = name
        sample_suffix = ""
        if typ == "counter":
            if name.endswith("_total"):
                family_name = name[:-len("_total")]
            else:
                sample_suffix = "_total"
        family = parsed.pop(family_name, None)
        if family is None:
            problems.append(f"family {name} is missing")
            continue
        if family.type != typ:
            problems.append(f"family {name}: type {family.type}, want {typ}")
        if family.documentation != want.get("help", ""):
            problems.append(f"family {name}: help {family.documentation!r}, "
                            f"want {want.get('help', '')!r}")
        got = {}
        for sample in family.samples:
            key = sample_key(sample.name, sample.labels)
            if key in got:
                problems.append(f"family {name}: duplicate sample {key}")
            got[key] = sample.value
        wanted = {}
        for sample_name, labels, value in want["samples"]:
            wanted[sample_key(sample_name + sample_suffix, labels)] = (
                float(value))
        for key in sorted(set(got) | set(wanted)):
            if key not in got:
                problems.append(f"family {name}: missing sample {key}")
            elif key not in wanted:
                problems.append(f"family {name}: unexpected sample {key}")
            elif not same_value(got[key], wanted[key]):
                problems.append(f"family {name}: sample {key} = {got[key]}, "
                                f"want {wanted[key]}")
        if typ == "histogram":
            check_histograms(family, problems)
    for name in parsed:
        problems.append(f"unexpected family {name}")


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        text = f.read()
    with open(argv[2], encoding="utf-8") as f:
        expected = json.load(f)
    problems = []
    check_grammar(text, problems)
    check_families(text, expected, problems)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(f"ok: {len(expected['families'])} families")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
