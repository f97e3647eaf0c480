"""The ``fairsched:`` series on vLLM's ``/metrics``, read from the engines' snapshots.

``/metrics`` is served by the API server's process and the scheduler runs in the engine
cores (``metrics.snapshot`` says why a file between them), so this is a custom collector:
it builds its metric families from every engine's last snapshot each time the registry
is scraped, with vLLM's own ``model_name`` and ``engine`` labels. Every family is yielded
for every engine once that engine has written a snapshot, zero or not, so the names
exist from the first scrape; a family whose section the snapshot lacks (no LPRS, no
guard, no APC) is left out.
"""

from __future__ import annotations

import json
import logging
import time
import weakref
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .reading import queue_now, snapshot_age
from .snapshot import read_snapshots

logger = logging.getLogger("vllm.fairsched")

LABELS = ("model_name", "engine")
"""vLLM's own per-engine labels, so the series join vLLM's."""

_FAMILIES: dict[str, tuple[type[Metric], str, tuple[str, ...]]] = {
    "fairsched:queue_wait_seconds": (
        HistogramMetricFamily,
        "Time from arrival to the first step that scheduled the request, by prompt class "
        "and priority tier.", ("class", "tier")),
    "fairsched:abandoned_requests": (
        CounterMetricFamily, "Requests aborted before any step scheduled them.",
        ("class", "tier")),
    "fairsched:reordered_requests": (
        CounterMetricFamily,
        "Requests first scheduled while an earlier arrival was still waiting.", ()),
    "fairsched:overdue_requests": (
        CounterMetricFamily, "Requests first scheduled after their guard deadline.", ()),
    "fairsched:overdue_lateness_seconds": (
        HistogramMetricFamily, "How late an overdue request was first scheduled.", ()),
    "fairsched:guard_gain": (
        GaugeMetricFamily,
        "How much of its slack and size allowance the FCFS guard gives new deadlines "
        "(1: all; 0: arrival order), as its tail watch steers it.", ()),
    "fairsched:guard_step_backs": (
        CounterMetricFamily,
        "Times the guard's tail watch found the TTFT tail longer than FCFS's and lowered "
        "the gain.", ()),
    "fairsched:aging_alpha": (
        GaugeMetricFamily, "Aging's current alpha (tokens of priority per second waited).",
        ()),
    "fairsched:lprs_fallback_steps": (
        CounterMetricFamily, "Steps LPRS ran on the token budget instead of predictions.",
        ("reason",)),
    "fairsched:lprs_falling_back": (
        GaugeMetricFamily, "1 while LPRS's guard has it on the token budget.", ()),
    "fairsched:lprs_prediction_relative_error": (
        HistogramMetricFamily,
        "|measured - predicted| / measured step time of each batch LPRS dispatched.", ()),
    "fairsched:lprs_bias_seconds": (
        GaugeMetricFamily, "LPRS's running correction added to predicted step times.", ()),
    "fairsched:lprs_model": (
        InfoMetricFamily, "Where LPRS's latency model came from, and its online fit now.",
        ()),
    "fairsched:apc_decisions": (
        CounterMetricFamily, "Active prefill control's decisions, by outcome.",
        ("outcome",)),
    "fairsched:plugin_failures": (
        CounterMetricFamily,
        "Steps that ran as stock vLLM because the plugin's work failed, by place.",
        ("place",)),
    "fairsched:waiting_requests": (
        GaugeMetricFamily, "Requests not yet scheduled, by prompt class.", ("class",)),
    "fairsched:waiting_prompt_tokens": (
        GaugeMetricFamily, "Prompt tokens of the requests not yet scheduled (the prefill "
        "work queued, before prefix-cache hits), by prompt class.", ("class",)),
    "fairsched:oldest_wait_seconds": (
        GaugeMetricFamily, "Wait so far of the oldest request not yet scheduled, by "
        "prompt class (0 when none waits).", ("class",)),
    "fairsched:scheduler_steps": (CounterMetricFamily, "Engine steps scheduled.", ()),
    "fairsched:snapshot_age_seconds": (
        GaugeMetricFamily, "Seconds since the engine wrote the figures shown.", ()),
    "fairsched:policy": (
        InfoMetricFamily, "The engine's fairsched policy and its non-default settings.", ()),
}
_EXPOSED_SUFFIX = {CounterMetricFamily: "_total", InfoMetricFamily: "_info"}

METRIC_NAMES: tuple[str, ...] = tuple(
    name + _EXPOSED_SUFFIX.get(kind, "") for name, (kind, _doc, _labels) in _FAMILIES.items())
"""The exposed names (a histogram's without ``_bucket``, ``_sum``, ``_count``): what
dashboards and alerts may query."""

_Sample = tuple[tuple[str, ...], Any]
"""Per-series label values after ``LABELS``, and the value: a number, a histogram's
``(buckets, sum)``, or an info's labels."""


class SnapshotCollector(Collector):
    """One launch's ``fairsched:`` families, read from its engines' snapshots per scrape."""

    def __init__(self, metrics_dir: str | None, instance_id: str) -> None:
        self.metrics_dir = metrics_dir
        self.instance_id = instance_id

    def describe(self) -> list[Metric]:
        """Nothing: the registry would otherwise call :meth:`collect` to learn the names
        when the collector is registered, before any engine has written."""
        return []

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        families: dict[str, Metric] = {}
        for document in read_snapshots(self.metrics_dir, self.instance_id):
            try:
                labels = [str(document["model_name"]), str(document["engine"])]
                samples = _samples(document, now)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                # One bad file must not fail vLLM's whole /metrics scrape.
                logger.warning("fairsched: skipping engine %s's metrics snapshot: %r",
                               document.get("engine"), exc)
                continue
            for name, entries in samples.items():
                family = families.get(name)
                if family is None:
                    kind, documentation, extra = _FAMILIES[name]
                    family = families[name] = kind(name, documentation,
                                                   labels=[*LABELS, *extra])
                for extra_values, value in entries:
                    _add(family, [*labels, *extra_values], value)
        yield from (families[name] for name in _FAMILIES if name in families)


def _samples(document: dict[str, Any], now: float) -> dict[str, list[_Sample]]:
    """Family name -> samples of one engine's document; a family it has no section for
    is absent. Every value is converted here, so a malformed document fails here."""
    wait_bounds = document["wait_buckets"]
    out: dict[str, list[_Sample]] = {
        "fairsched:queue_wait_seconds": [
            ((str(e["class"]), str(e["tier"])), _histogram(wait_bounds, e))
            for e in document["queue_wait"]],
        "fairsched:abandoned_requests": [
            ((str(e["class"]), str(e["tier"])), float(e["count"]))
            for e in document["abandoned"]],
        "fairsched:reordered_requests": [((), float(document["reordered"]))],
    }
    overdue = document.get("overdue")
    if overdue is not None:
        out["fairsched:overdue_requests"] = [((), float(overdue["count"]))]
        out["fairsched:overdue_lateness_seconds"] = [
            ((), _histogram(document["lateness_buckets"], overdue))]
    watch = document.get("tail_watch")
    if watch is not None:
        out["fairsched:guard_gain"] = [((), float(watch["gain"]))]
        out["fairsched:guard_step_backs"] = [((), float(watch["step_backs"]))]
    if document.get("alpha") is not None:
        out["fairsched:aging_alpha"] = [((), float(document["alpha"]))]
    lprs = document.get("lprs")
    if lprs is not None:
        out["fairsched:lprs_fallback_steps"] = [
            ((str(reason),), float(n)) for reason, n in lprs["fallback_steps"].items()]
        out["fairsched:lprs_falling_back"] = [((), float(bool(lprs["falling_back"])))]
        out["fairsched:lprs_prediction_relative_error"] = [
            ((), _histogram(document["error_buckets"], lprs["error"]))]
        out["fairsched:lprs_bias_seconds"] = [((), float(lprs["bias_ms"]) / 1000.0)]
        if lprs.get("model"):
            out["fairsched:lprs_model"] = [((), {"source": str(lprs["model"])})]
    apc = document.get("apc")
    if apc is not None:
        out["fairsched:apc_decisions"] = [
            ((str(outcome),), float(n)) for outcome, n in apc.items()]
    out["fairsched:plugin_failures"] = [
        ((str(place),), float(n)) for place, n in document["failures"].items()]
    queue = queue_now(document, now)
    out["fairsched:waiting_requests"] = [
        ((klass,), float(entry["waiting"])) for klass, entry in queue.items()]
    out["fairsched:waiting_prompt_tokens"] = [
        ((klass,), float(entry["prompt_tokens"])) for klass, entry in queue.items()]
    out["fairsched:oldest_wait_seconds"] = [
        ((klass,), entry["oldest_wait_s"]) for klass, entry in queue.items()]
    out["fairsched:scheduler_steps"] = [((), float(document["steps"]))]
    out["fairsched:snapshot_age_seconds"] = [((), snapshot_age(document, now))]
    policy = document["policy"]
    out["fairsched:policy"] = [((), {
        "policy": str(policy["name"]),
        "description": str(policy["description"]),
        "settings": json.dumps(policy["settings"], sort_keys=True, separators=(",", ":")),
    })]
    return out


def _histogram(bounds: list[float], entry: dict[str, Any]) -> tuple[list[tuple[str, float]],
                                                                     float]:
    """The snapshot's per-bucket counts (one more for +Inf) as Prometheus's cumulative
    buckets, and the sum."""
    counts = [float(n) for n in entry["counts"]]
    if len(counts) != len(bounds) + 1:
        raise ValueError(f"{len(counts)} bucket counts for {len(bounds)} bounds")
    edges = [floatToGoString(float(b)) for b in bounds] + ["+Inf"]
    return list(zip(edges, accumulate(counts))), float(entry["sum"])


def _add(family: Metric, labels: list[str], value: Any) -> None:
    if isinstance(family, HistogramMetricFamily):
        buckets, total = value
        family.add_metric(labels, buckets, total)
    else:
        family.add_metric(labels, value)


_COLLECTORS: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, SnapshotCollector]] = (
    weakref.WeakKeyDictionary())
"""The collector registered per registry and launch, so registering again replaces it."""


def register_collector(vllm_config: Any, metrics_dir: str | None,
                       registry: CollectorRegistry | None = None) -> None:
    """Serve this launch's ``fairsched:`` series on ``/metrics``: register a collector
    for ``vllm_config.instance_id`` in ``registry``, by default the one vLLM serves. For
    one launch it is registered once: registering again replaces the earlier collector.

    Known limit: with ``--api-server-count`` > 1 vLLM serves a multiprocess registry,
    rebuilt from its metric files, which no collector of this process reaches (and each
    API server builds its own engine config, with another instance id than the engines'),
    so the series are not exported there; a warning says so.
    """
    if registry is None:
        registry = _served_registry()
        if registry is None:
            logger.warning(
                "fairsched: vLLM serves /metrics from a multiprocess registry "
                "(PROMETHEUS_MULTIPROC_DIR is set, as with --api-server-count > 1); the "
                "fairsched: series are not exported there")
            return
    collectors = _COLLECTORS.setdefault(registry, {})
    previous = collectors.pop(vllm_config.instance_id, None)
    if previous is not None:
        registry.unregister(previous)
    collector = SnapshotCollector(metrics_dir, vllm_config.instance_id)
    registry.register(collector)
    collectors[vllm_config.instance_id] = collector


def _served_registry() -> CollectorRegistry | None:
    """The registry vLLM's ``/metrics`` serves, or None when vLLM builds a multiprocess
    one of its own (a collector registered in this process would never be read)."""
    try:
        from vllm.v1.metrics.prometheus import get_prometheus_registry
    except ImportError:
        return REGISTRY
    registry = get_prometheus_registry()
    return registry if registry is REGISTRY else None
