"""What the policy layer sees of a vLLM request: its :class:`RequestView`.

A waiting request's remaining prefill counts only the part not in vLLM's prefix cache,
looked up without side effects when it enters the queue (and again, under vLLM's
cache-aware admission, when a sibling may have cached more since).
"""

from __future__ import annotations

import itertools
import math
from contextlib import closing
from typing import Any

from vllm.v1.request import Request, RequestStatus

from ..policies import RequestView


def request_view(request: Request, deadline: float = math.inf,
                 cached_tokens: int = 0) -> RequestView:
    """The policy layer's copy of a vLLM request.

    A waiting request always has a token to compute: vLLM recomputes the last one even
    when the prefix cache or a KV transfer holds them all (it needs its logits)."""
    computed = request.num_computed_tokens
    if request.status != RequestStatus.RUNNING:
        computed = min(computed, max(request.num_tokens - 1, 0))
    # Positional: a third of the keyword call's cost, for a view built per candidate
    # per step (the fields in RequestView's order).
    return RequestView(request.request_id, request.arrival_time, request.num_prompt_tokens,
                       computed, request.num_output_tokens, request.max_tokens,
                       request.priority, deadline, cached_tokens)


def prefill_work(request: Request) -> int:
    """Tokens a waiting or running request still has to prefill."""
    return max(request.num_tokens - request.num_computed_tokens, 0)


def has_prefill_work(request: Request, num_computed_tokens: int) -> bool:
    """Whether the next tokens after ``num_computed_tokens`` are prefill, not a decode.

    Prompt tokens are left (even one: the prompt's last chunk), or more than one token
    (a preempted request recomputing its output). A decode computes the one token
    sampled last; under async scheduling its in-flight token is already counted,
    leaving zero. Speculative tokens are not in ``num_tokens``.
    """
    return (num_computed_tokens < request.num_prompt_tokens
            or request.num_tokens - num_computed_tokens > 1)


def _may_read_prefix_cache(manager: Any, request: Request) -> bool:
    """vLLM's own test (``prefix_cache_lookup_enabled``, 0.32+), or what it tests on
    older releases: caching on and the request not skipping cache reads."""
    enabled = getattr(manager, "prefix_cache_lookup_enabled", None)
    if enabled is not None:
        return enabled(request)
    return manager.enable_caching and not request.skip_reading_prefix_cache


def _longest_cache_hit(request: Request, aux_output_connector: Any) -> int:
    """The longest hit vLLM accepts: all but the last token, bounded from 0.34 on by the
    request's own limit (prompt logprobs, skipped cache reads) and by the auxiliary-output
    connector's (the outputs it retains for the prefix)."""
    bound = (None if aux_output_connector is None
             else aux_output_connector.max_cache_hit(request))
    limit = getattr(request, "get_max_cache_hit_length", None)
    if limit is not None:
        return limit(bound)
    return request.num_tokens - 1 if bound is None else min(bound, request.num_tokens - 1)


class RequestViews:
    """The scheduler's views of its requests, with their deadlines and cached prefixes
    (part of ``scheduler.FairSchedulingMixin``, whose per-request hooks keep
    ``_deadlines`` and ``_cached_prefix``)."""

    def _deadline(self, request: Request) -> float:
        return self._deadlines.get(request.request_id, math.inf)

    def _view(self, request: Request) -> RequestView:
        view = request_view(request, self._deadline(request), self._cached_tokens(request))
        if self._replays_prefix and request.status != RequestStatus.RUNNING:
            # vLLM rewinds a waiting request's hit by its replay window when it admits
            # it: count the whole prompt (a cap above what vLLM schedules costs nothing).
            view.computed_tokens = 0
        return view

    def _cached_tokens(self, request: Request) -> int:
        """A waiting request's prompt prefix in the prefix cache, as of when it first
        entered the waiting queue or last re-entered it after a preemption (looked up
        then, see :meth:`_lookup_cached`, and kept: re-keying and skipped requests
        coming back cost no lookup); 0 for a request with computed tokens, whose blocks
        are its own."""
        if request.num_computed_tokens > 0:
            return 0
        cached = self._cached_prefix.get(request.request_id)
        if cached is None:
            cached = self._lookup_cached(request)
        return cached

    def _lookup_cached(self, request: Request) -> int:
        """How many of the request's tokens vLLM's waiting loop would find cached now.

        The coordinator's ``find_longest_cache_hit`` is the lookup vLLM's own
        ``get_computed_blocks`` makes, without its side effects (prefix-cache stats, KV
        events, block references); like vLLM it leaves the last token to compute. Not
        under bounded prefix replay (``prefix_replay_tokens``, sliding-window models),
        where vLLM recomputes part of a hit: the whole prompt counts then, and a cap above
        what vLLM schedules costs nothing."""
        manager = self.kv_cache_manager
        cached = 0
        if (self.fairsched_config.prefix_aware and request.num_computed_tokens == 0
                and not self._replays_prefix and _may_read_prefix_cache(manager, request)):
            _blocks, cached, *_ = manager.coordinator.find_longest_cache_hit(
                request.block_hashes,
                _longest_cache_hit(request, getattr(self, "aux_output_connector", None)))
        self._cached_prefix[request.request_id] = cached
        return cached

    def _reorder_waiting_by_cached_prefix(self) -> None:
        """vLLM's cache-aware admission (0.34+, ``cache_aware_admission_window`` with
        prefix caching), under the policy's order.

        Stock vLLM moves the window's requests with a cached prefix to its front. Under a
        policy the key ranks, and a cached prefix is already in it as less remaining
        prefill (``RequestView.remaining_prefill`` counts the uncached part); but it is
        looked up when a request enters the queue, so a prefix cached since (a sibling
        request computed it) still ranks at the whole prompt. Here, on each step where
        KV usage is at least ``cache_aware_admission_threshold``, the first N waiting
        requests in policy order are looked up again, and each whose cached prefix
        changed re-enters the queue under its fresh key. Under ``fcfs`` the queue is
        vLLM's own and stock's reordering runs unchanged."""
        if self.fairsched_policy.follows_vllm_order:
            super()._reorder_waiting_by_cached_prefix()
            return
        if (len(self.waiting) < 2
                or self.kv_cache_manager.usage < self.cache_aware_threshold):
            return
        with closing(self.waiting.iter_in_order()) as ordered:
            head = list(itertools.islice(ordered, self.cache_aware_window))
        for request in head:
            if request.status != RequestStatus.WAITING or request.num_computed_tokens:
                continue
            before = self._cached_prefix.get(request.request_id)
            if self._lookup_cached(request) != before:
                self.waiting.remove_request(request)
                self.waiting.add_request(request)
