"""Audits of stores, returning plain data (the CLI only renders it).

* :func:`summarize` -- what ``r3store inspect`` prints;
* :func:`validate` -- checksums and capture faults, as :class:`Finding` s in a
  :class:`ValidationReport`;
* :func:`stats` -- per-layer expert load and sequence lengths;
* :func:`diff` -- R3 mismatch figures between two stores of the same samples;
* :func:`show` -- the ids of one sample;
* :func:`collect_garbage` -- uncommitted leftovers of crashed writers (``r3store gc``).

Scans stream row block by row block and use a thread pool on remote backends (see
``r3store/audit/_scan.py`` for the thread-safety rule: one RouteReader per thread).
Each scan is also a :class:`ScanPlan` (``plan_validate``, ``plan_stats``, ``plan_diff``):
units that name the commits they read (map) and a pure merge, run here by
:func:`run_plan` or as Ray tasks by ``r3store.ray``, with the same result.
"""

from r3store.audit._diff import diff, plan_diff
from r3store.audit._findings import ACCEPTED, INFORMATIONAL, KINDS, Finding, ValidationReport, format_rows
from r3store.audit._gc import Leftover, collect_garbage
from r3store.audit._physical import physical_id_test
from r3store.audit._scan import ScanPlan, ScanUnit, run_plan
from r3store.audit._show import parse_layers, parse_rows, show
from r3store.audit._stats import plan_stats, stats
from r3store.audit._summary import summarize
from r3store.audit._validate import plan_validate, validate, zero_layer_min_rows

__all__ = [
    "ACCEPTED",
    "Finding",
    "INFORMATIONAL",
    "KINDS",
    "Leftover",
    "ScanPlan",
    "ScanUnit",
    "ValidationReport",
    "collect_garbage",
    "diff",
    "format_rows",
    "parse_layers",
    "parse_rows",
    "physical_id_test",
    "plan_diff",
    "plan_stats",
    "plan_validate",
    "run_plan",
    "show",
    "stats",
    "summarize",
    "validate",
    "zero_layer_min_rows",
]
