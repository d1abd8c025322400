#!/usr/bin/env python3
"""Validates Prometheus text exposition (read on stdin) with the official Python client's
parser, and the rules a scraper relies on: every family has HELP and TYPE, a histogram's buckets
are cumulative and end with +Inf equal to _count. Prints the family names, one per line.
Exit 0 valid, 1 not (the reason on stderr). Needs prometheus-client (the test venv has it).
"""
import math
import sys

from prometheus_client.parser import text_string_to_metric_families

text = sys.stdin.read()
problems = []
try:
    families = list(text_string_to_metric_families(text))
except Exception as error:  # the parser's own message names the line
    print("check-metrics: not valid exposition: %s" % error, file=sys.stderr)
    sys.exit(1)
helps = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")}
types = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
for family in families:
    if family.name not in helps and family.name + "_total" not in helps:
        problems.append("%s has no HELP" % family.name)
    if family.name not in types and family.name + "_total" not in types:
        problems.append("%s has no TYPE" % family.name)
    if family.type == "histogram":
        buckets = [(float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket")]
        count = [s.value for s in family.samples if s.name.endswith("_count")]
        values = [v for _, v in sorted(buckets)]
        if values != sorted(values):
            problems.append("%s: buckets are not cumulative" % family.name)
        if not buckets or not math.isinf(max(b for b, _ in buckets)):
            problems.append("%s: no +Inf bucket" % family.name)
        elif count and max(buckets)[1] != count[0]:
            problems.append("%s: +Inf bucket %s differs from _count %s" % (family.name, max(buckets)[1], count[0]))
for problem in problems:
    print("check-metrics: " + problem, file=sys.stderr)
for family in families:
    print(family.name)
sys.exit(1 if problems else 0)
