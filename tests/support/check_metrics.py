#!/usr/bin/python3
"""Parses a Prometheus text exposition (stdin) with prometheus_client's own
parser and checks the counts the test expects:
   check_metrics.py --ranks N COLLECTIVE=N[,STATUS] ...
each meaning: ccs_ops_total{collective=COLLECTIVE,status=STATUS or CCS_OK}
summed over tenants equals N; every histogram is consistent; and each
collective's bus bytes are its bytes times nccl-tests' factor for N ranks
(every op of the test ran on comms of N ranks)."""
import sys
from prometheus_client.parser import text_string_to_metric_families

args = sys.argv[1:]
ranks = int(args[1]) if args[:1] == ["--ranks"] else 0
args = args[2:] if ranks else args
if ranks < 3:
    sys.exit("check_metrics.py: --ranks N with N >= 3 (with 2 ranks the bus factors are 1)")
families = {f.name: f for f in text_string_to_metric_families(sys.stdin.read())}
ops = families["ccs_ops"]  # the parser drops the _total suffix of counters
failed = False
for want in args:
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
# REFERENCE.md's factors; the daemon rounds each series to a whole byte
n = ranks
factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
          "all_to_all": (n - 1) / n, "gather": (n - 1) / n, "scatter": (n - 1) / n}
bus = families["ccs_op_bus_bytes"]
seen = {s.labels["collective"] for s in bus.samples}
for coll in sorted(seen):
    nbytes = sum(s.value for s in families["ccs_op_bytes"].samples
                 if s.labels["collective"] == coll and s.labels["status"] == "CCS_OK")
    got = sum(s.value for s in bus.samples if s.labels["collective"] == coll)
    want = nbytes * factor.get(coll, 1.0)
    print(f"{coll}: bytes {nbytes:g}, bus bytes {got:g} (want {want:g})")
    failed |= abs(got - want) > 1
failed |= "all_reduce" not in seen
for g in ("ccs_clients", "ccs_registered_bytes", "ccs_executor_threads", "ccs_uptime_seconds"):
    failed |= g not in families
sys.exit(1 if failed else 0)
