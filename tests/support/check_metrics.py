#!/usr/bin/python3
"""Parses a Prometheus text exposition (stdin) with prometheus_client's own
parser and checks the counts the test expects:
   check_metrics.py COLLECTIVE=N[,STATUS] ...
each meaning: ccs_ops_total{collective=COLLECTIVE,status=STATUS or CCS_OK}
summed over tenants equals N; and every histogram is consistent."""
import sys
from prometheus_client.parser import text_string_to_metric_families

families = {f.name: f for f in text_string_to_metric_families(sys.stdin.read())}
ops = families["ccs_ops"]  # the parser drops the _total suffix of counters
failed = False
for want in sys.argv[1:]:
    coll, rest = want.split("=")
    n, _, status = rest.partition(",")
    status = status or "CCS_OK"
    got = sum(s.value for s in ops.samples
              if s.name == "ccs_ops_total" and s.labels["collective"] == coll
              and s.labels["status"] == status)
    print(f"ccs_ops_total{{collective={coll},status={status}}} = {got:g} (want {n})")
    failed |= got != float(n)
hist = families["ccs_op_seconds"]
for coll in {s.labels["collective"] for s in hist.samples}:
    buckets = sorted((float(s.labels["le"]), s.value) for s in hist.samples
                     if s.name == "ccs_op_seconds_bucket" and s.labels["collective"] == coll)
    count = [s.value for s in hist.samples
             if s.name == "ccs_op_seconds_count" and s.labels["collective"] == coll][0]
    failed |= any(a[1] > b[1] for a, b in zip(buckets, buckets[1:])) or buckets[-1][1] != count
# all_reduce of n ranks: bus bytes = bytes x 2(n-1)/n; the test runs 2 ranks
bus = families["ccs_op_bus_bytes"]
ar_bytes = sum(s.value for s in families["ccs_op_bytes"].samples
               if s.labels["collective"] == "all_reduce" and s.labels["status"] == "CCS_OK")
ar_bus = sum(s.value for s in bus.samples if s.labels["collective"] == "all_reduce")
print(f"all_reduce bytes {ar_bytes:g}, bus bytes {ar_bus:g}")
failed |= ar_bus != ar_bytes
for g in ("ccs_clients", "ccs_registered_bytes", "ccs_executor_threads", "ccs_uptime_seconds"):
    failed |= g not in families
sys.exit(1 if failed else 0)
