"""Phases 3 and 4 of the scheduler's step: the running list's order and the plan's caps.

What the plan (``policies.plan``) needs is read here from vLLM's state, as vLLM's own
loop would meet it: the waiting requests it can admit (``adapter.admission``), the
decodes it will serve, its per-request bounds, free slots and KV room. Here too is the
check that skips the plan on the common light step, where vLLM's loop already gives each
running prefill what the plan would.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import closing

from vllm.v1.request import Request

from ..policies import Rank, RequestView, plan_prefill_caps
from ..policies.candidate_walk import ChunkLimits
from ..policies.plan import step_rank
from .admission import LoraSlots, admissible, admitting_queues, free_running_slots, pause_state
from .admission import PAUSED_ALL, UNPAUSED
from .queue import PolicyRequestQueue, PriorityLevelQueue
from .request_views import prefill_work


class StepPlanning:
    """The plan's inputs and the running list's order (part of
    ``scheduler.FairSchedulingMixin``)."""

    def _plan_step(self, views: dict[str, RequestView],
                   throttle_prefills: bool = False) -> dict[str, int] | None:
        """Reorder ``self.running`` where asked and return the token caps of its partial
        prefills; None when vLLM's own loop already serves the policy's order, when
        vLLM schedules no prefill this step (everything paused, prefills deferred), or
        when no running prefill is there to cap and no chunk rule decides admissions.

        ``views`` holds the running requests' views when they were needed already; those
        of partial prefills are added here. Decodes are only counted, not viewed, unless
        the order or the chunk rule needs them: a step can carry hundreds."""
        policy = self.fairsched_policy
        rule = self._chunk_rule
        reorder = self._decodes_first or policy.orders_decodes
        if policy.follows_vllm_order and rule is None and not reorder:
            return None
        state = pause_state(self)
        if state == PAUSED_ALL or self._defers_prefills(throttle_prefills):
            return None
        # One pass over the running list, which can hold hundreds of decodes; they are
        # listed only when the order or the plan needs them.
        prefills: list[Request] = []
        decode_after_prefill = False
        for request in self.running:
            if request.is_prefill_chunk:
                prefills.append(request)
            elif prefills:
                decode_after_prefill = True
        if policy.uses_deadlines:
            running = sum(map(prefill_work, prefills))
            policy.observe_backlog(
                self._now, self.waiting.work + self.kv_holding_waiting.work + running, running)
        if not reorder and rule is None and (
                not prefills
                or not decode_after_prefill
                and self._running_order_is_plan_order(prefills, views, state)):
            return None
        for request in prefills:
            if request.request_id not in views:
                views[request.request_id] = self._view(request)
        rank = step_rank(policy, self._now, self._by_priority)
        decodes = [request for request in self.running if not request.is_prefill_chunk]
        if reorder:
            prefills.sort(key=lambda request: rank(views[request.request_id]))
            if policy.orders_decodes:
                decodes.sort(key=lambda request: rank(views[request.request_id]))
            self.running[:] = decodes + prefills
            if rule is None and not prefills:
                return None
        decode_tokens = self._decode_tokens(decodes)
        if rule is not None:
            rule.begin_step(decode_tokens, self.max_num_active_reqs,
                            self.max_num_scheduled_tokens)
        limits = self._step_limits()
        input_budget = (self.scheduler_config.max_num_batched_tokens
                        - len(decode_tokens) * limits.slot_cost)
        # Closing the generator puts back what it took from the waiting heaps, also
        # when the plan raises.
        with closing(self._waiting_views()) as waiting:
            return plan_prefill_caps(
                policy,
                [views[request.request_id] for request in prefills],
                waiting,
                decode_tokens=sum(n for _ctx, n in decode_tokens),
                token_budget=min(self.max_num_scheduled_tokens, input_budget),
                free_slots=free_running_slots(self),
                free_kv_tokens=self._free_kv_tokens(),
                full_sequence_must_fit=bool(getattr(self, "scheduler_reserve_full_isl", False)),
                rule=rule,
                now=self._now,
                limits=limits,
                by_priority=self._by_priority,
            )

    def _running_order_is_plan_order(self, prefills: list[Request],
                                     views: dict[str, RequestView], state: int) -> bool:
        """Whether vLLM's own loop already gives each running prefill what the plan
        would cap it to, so the plan (and the decode count it needs) can be skipped.

        Without a chunk rule the plan's cap of a running prefill is what is left of the
        budget after the decodes and every better-ranked candidate. vLLM's running loop
        gives the same when it meets the decodes first, then the prefills in rank order,
        and no admissible waiting request ranks above the last of them (the plan
        admits a waiting request first only when it ranks strictly better). This is the
        common light step: one partial prefill behind the decodes, the queue's head
        ranked after it; the check costs a look at that head instead of the whole plan,
        and while :meth:`_still_ahead` vouches for its last answer, nothing. Under a
        policy whose running prefills come first, the prefills' own order is enough.
        ``views`` gets the views the check builds; ``state`` is vLLM's pause state."""
        if self._ahead is not None and self._still_ahead(prefills, state):
            return True
        policy = self.fairsched_policy
        rank = step_rank(policy, self._now, self._by_priority)
        for request in prefills:
            if request.request_id not in views:
                views[request.request_id] = self._view(request)
        if len(prefills) == 1:
            last = rank(views[prefills[0].request_id])
        else:
            ranks = [rank(views[request.request_id]) for request in prefills]
            if any(later < earlier for earlier, later in zip(ranks, ranks[1:])):
                return False
            last = ranks[-1]
        if policy.running_first:
            return True
        head, passed_over = self._first_waiting_rank(rank, state)
        holds = head is None or head > last
        self._ahead = (self._ahead_of_queue(prefills, state)
                       if holds and not passed_over else None)
        return holds

    def _ahead_of_queue(self, prefills: list[Request],
                        state: int) -> tuple[Request, int, int] | None:
        """What :meth:`_still_ahead` needs to vouch for a check that found the one running
        prefill ahead of every waiting request: the prefill and the queues' change
        counts. None where that cannot last: several prefills (their order among
        themselves can change), no prefill computed yet (its view still counts a cached
        prefix), keys that read more than the remaining work, priority levels, a pause,
        or requests holding KV blocks. (Nor when the check passed a waiting request over:
        it may become admissible ahead of the one compared; the caller knows.)"""
        policy = self.fairsched_policy
        if (len(prefills) != 1 or prefills[0].num_computed_tokens == 0
                or not policy.key_follows_remaining_work or self._by_priority
                or state != UNPAUSED or self.kv_holding_waiting):
            return None
        return prefills[0], self.waiting.changes, self.kv_holding_waiting.changes

    def _still_ahead(self, prefills: list[Request], state: int) -> bool:
        """Whether the one running prefill is still ahead of every waiting request.

        Since the last check nothing entered a waiting queue and no key was taken again
        (the change counts): the queues only lost requests, and a waiting request keeps
        its key. The prefill is the one the check found ahead, its key fallen as it
        computed; or that one is done and this one was admitted since, from the head of
        the queue, so ahead of every request left there while its key is at most the
        one it was queued under. What time changes is the deadline lane: a waiting
        request that went overdue outranks the prefill unless the prefill is overdue
        too, with an earlier deadline."""
        prefill, waiting_changes, held_changes = self._ahead
        waiting = self.waiting
        if (len(prefills) != 1 or state != UNPAUSED
                or waiting.changes != waiting_changes
                or self.kv_holding_waiting.changes != held_changes):
            return False
        if prefills[0] is not prefill:
            prefill = prefills[0]
            popped = waiting.last_popped
            if (popped is None or popped[0] is not prefill
                    or prefill.num_computed_tokens == 0
                    or prefill_work(prefill) > popped[1].remaining_prefill):
                return False
            self._ahead = prefill, waiting_changes, held_changes
        policy = self.fairsched_policy
        if not policy.uses_deadlines:
            return True
        if waiting:
            # The full check looks at the queue's head, where a guard may make a deadline
            # due: look there too, so both see the same cutoff.
            waiting.peek_request()
        cutoff = policy.overdue_cutoff(self._now)
        earliest = waiting.earliest_deadline()
        if earliest > cutoff:
            return True
        own = self._deadline(prefill)
        return own <= cutoff and own < earliest

    def _defers_prefills(self, throttle_prefills: bool) -> bool:
        """vLLM's data-parallel prefill balancing: on a throttled step that is not
        capacity-bound, it defers every prefill while a decode runs."""
        return (throttle_prefills and not getattr(self, "prefill_capacity_bound", False)
                and any(not r.is_prefill_chunk for r in self.running))

    def _step_limits(self) -> ChunkLimits:
        """vLLM's per-request bounds this step: the long-prefill threshold as its loop
        computes it (off for a lone request, floored at a fair share when adaptive)
        and the input budget each scheduled request reserves for drafts."""
        threshold = self.scheduler_config.long_prefill_token_threshold
        if threshold > 0 and self.fairsched_surface.threshold_spares_lone_request:
            num_running, num_waiting = self.get_request_counts()
            eligible = num_running + num_waiting
            if eligible <= 1:
                threshold = 0
            elif getattr(self, "adaptive_long_prefill_threshold", False):
                threshold = max(threshold,
                                self.scheduler_config.max_num_batched_tokens // eligible)
        spec = self.vllm_config.speculative_config
        slots = getattr(spec, "max_num_new_slots_for_drafting", 0) if spec is not None else 0
        return ChunkLimits(chunk_limit=threshold, slot_cost=slots)

    def _waiting_views(self) -> Generator[RequestView, None, None]:
        """The waiting requests vLLM's waiting loop can admit this step, in the order it
        will meet them (``adapter.admission``; under ``fcfs`` the queues are vLLM's own,
        whose iteration is that order)."""
        loras = LoraSlots.of(self)
        view = self._view
        for queue in admitting_queues(self):
            if not queue:  # usually the KV-holding queue: no iterator to set up
                continue
            if not isinstance(queue, (PolicyRequestQueue, PriorityLevelQueue)):
                for request in queue:
                    if admissible(self, request, loras):
                        yield view(request)
                continue
            with closing(queue.iter_in_order()) as requests:
                for request in requests:
                    if admissible(self, request, loras):
                        yield view(request)

    def _first_waiting_rank(self, rank: Callable[[RequestView], Rank],
                            state: int) -> tuple[Rank | None, bool]:
        """The rank of what :meth:`_waiting_views` yields first, and whether a waiting
        request ahead of it was passed over as not admissible. In the common case, an
        admissible head of the first non-empty queue, it is read without setting up the
        ordered iteration, and from the key it is queued under when it is not overdue
        (no view to build: the key is the one the queue will serve it by)."""
        for queue in admitting_queues(self, state):
            if queue:
                if isinstance(queue, PolicyRequestQueue):
                    head, key = queue.peek_keyed()
                else:
                    head, key = queue.peek_request(), None
                if admissible(self, head, LoraSlots.of(self)):
                    if key is not None:
                        return self.fairsched_policy.rank_of_key(key), False
                    return rank(self._view(head)), False
                break
        else:
            return None, False  # nothing waits
        with closing(self._waiting_views()) as waiting:
            head = next(waiting, None)
        return (None if head is None else rank(head)), True

    def _decode_tokens(self, decodes: list[Request]) -> list[tuple[int, int]]:
        """``(context length, tokens)`` of each decode vLLM's running loop will serve (1
        plus speculative tokens), leaving out, as vLLM does, a request whose in-flight
        step already reaches ``max_tokens`` (async scheduling) and one whose previous
        decode is still in the pipeline (pipeline parallelism)."""
        out = []
        append = out.append
        step = self.current_step + 1  # schedule() counts the step before its loop
        for r in decodes:
            placeholders = r.num_output_placeholders
            computed = r.num_computed_tokens
            if (
                placeholders > 0
                and computed + 2 - placeholders >= r.num_prompt_tokens + r.max_tokens
            ):
                continue
            if step < getattr(r, "next_decode_eligible_step", 0):
                continue
            append((computed, max(r.num_tokens_with_spec + placeholders - computed, 0)))
        return out

    def _free_kv_tokens(self) -> int:
        manager = self.kv_cache_manager
        free_blocks = manager.block_pool.get_num_free_blocks()
        free_blocks -= getattr(manager, "watermark_blocks", 0)
        return max(free_blocks, 0) * self.block_size
