"""Running requests held out of one step: phase 2 of the scheduler's step.

With ``service: ranked``, the running requests outside the top ``max_batch_size``; with
``decode_share``, while prefill work waits, the newest decodes beyond their share of the
budget (``policies.decode_hold``). They wait in ``self._hidden``, keeping their KV cache,
until ``_undo_step`` puts them back after vLLM's loop.
"""

from __future__ import annotations

import time
from contextlib import closing

from vllm.v1.request import Request

from ..policies import RequestView, ranked_service
from ..policies.decode_hold import decodes_to_hold, newest_within_tpot
from .admission import PAUSED_ALL, free_running_slots, pause_state
from .request_views import prefill_work


class HeldRequests:
    """Hiding running requests for a step (part of ``scheduler.FairSchedulingMixin``)."""

    def _hide_unranked(self, views: dict[str, RequestView]) -> None:
        """Ranked service: keep in ``self.running`` only the running requests in the top
        ``max_batch_size`` and cap admissions at the waiting ones in it; the rest wait in
        ``self._hidden`` until the step is over (also if anything here fails). Under KV
        pressure the worst-ranked hidden requests are preempted, so the served ones can
        always grow."""
        with closing(self._waiting_views()) as waiting:
            step = ranked_service(
                self.fairsched_policy, views.values(), waiting,
                self.fairsched_config.max_batch_size,
            )
        key = self.fairsched_policy.key
        hidden = [r for r in self.running if r.request_id not in step.served_running]
        hidden.sort(key=lambda request: key(views[request.request_id]))
        self._hidden = hidden
        self.running[:] = [r for r in self.running if r.request_id in step.served_running]
        self.max_num_active_reqs = min(
            self.max_num_active_reqs, len(self.running) + step.admissions
        )
        needed = self._blocks_to_grow()
        while hidden and self.kv_cache_manager.block_pool.get_num_free_blocks() < needed:
            self._preempt_request(
                hidden[-1], time.monotonic(), drop_stale_output=self.requires_kv_delivery
            )
            hidden.pop()

    def _blocks_to_grow(self) -> int:
        """Free KV blocks the requests in ``self.running`` need for a full step: a
        budget's worth of new tokens plus a block each. With fewer free, a request left out
        of the step (hidden, held) would keep blocks vLLM then frees by preempting a
        served one."""
        return -(-self.max_num_scheduled_tokens // self.block_size) + len(self.running)

    def _hold_newest_decodes(self, throttle_prefills: bool) -> None:
        """``decode_share`` (``policies.decode_hold``): while prefill work waits, the last
        decodes in vLLM's running order beyond the cap (the newest: vLLM appends what it
        admits) wait in ``self._hidden`` for this step, and vLLM may admit as many
        requests as before. Nothing is held when vLLM schedules no prefill this step, or
        under KV pressure, where a held decode would keep blocks that vLLM then frees by
        preempting a served request."""
        running = self.running
        decodes = [request for request in running if not request.is_prefill_chunk]
        if self._max_tpot_s:
            for request in decodes:
                self._decode_start.setdefault(
                    request.request_id, (self._now, request.num_output_tokens))
            if any(request.is_prefill_chunk for request in running[:len(decodes)]):
                # A held decode returns behind the step's prefills, where vLLM's loop
                # would leave it without budget after the bound says it must run.
                running[:] = decodes + [r for r in running if r.is_prefill_chunk]
        if len(decodes) <= self._decode_cap:
            return
        if pause_state(self) == PAUSED_ALL or self._defers_prefills(throttle_prefills):
            return
        if self.kv_cache_manager.block_pool.get_num_free_blocks() < self._blocks_to_grow():
            return
        budget = self.max_num_scheduled_tokens
        hold = decodes_to_hold(len(decodes), self._tokens_per_decode,
                               self._prefill_work_within(budget), budget, self._decode_cap)
        held = self._within_tpot(decodes[self._decode_cap:], hold) if hold else []
        if not held:
            return
        ids = {id(request) for request in held}
        self._hidden = [request for request in running if id(request) in ids]
        running[:] = [request for request in running if id(request) not in ids]
        self.max_num_active_reqs -= len(held)

    def _within_tpot(self, holdable: list[Request], hold: int) -> list[Request]:
        """The ``hold`` newest of ``holdable``, or under ``decode_share_max_tpot_ms`` the
        newest of them whose time per output token since their first decode step is
        still below the bound (possibly fewer)."""
        if not self._max_tpot_s:
            return holdable[-hold:]
        now, starts = self._now, self._decode_start
        times = []
        for request in holdable:
            start, tokens = starts[request.request_id]
            times.append((now - start, request.num_output_tokens - tokens))
        return [holdable[i] for i in newest_within_tpot(times, hold, self._max_tpot_s)]

    def _prefill_work_within(self, budget: int) -> int:
        """The prefill tokens this step could schedule, counted up to ``budget``: the
        running prefills' remaining work, then the waiting requests vLLM can admit, in
        the order it meets them, as many as it has free slots for."""
        work = sum(prefill_work(r) for r in self.running if r.is_prefill_chunk)
        slots = free_running_slots(self)
        if work >= budget or slots <= 0:
            return work
        with closing(self._waiting_views()) as waiting:
            for view in waiting:
                work += view.remaining_prefill
                slots -= 1
                if work >= budget or slots == 0:
                    break
        return work
