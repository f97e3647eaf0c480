"""Which waiting requests vLLM's waiting loop can admit this step, read without side effects.

The plan must see exactly these, in the order vLLM's loop meets them: a request vLLM skips
(a grammar still compiling, KV still arriving, a streaming session waiting for input,
undelivered stale output, a LoRA over ``max_loras``) must not take a share of the budget
that then goes unused, and under a pause vLLM admits from fewer queues or none. vLLM's
own checks (``_handle_blocked_waiting_request``) promote a request's status as they look,
so they are restated here as pure reads; attributes a vLLM version lacks count as "not
blocked", as that version has no such state.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.request import Request, RequestStatus

UNPAUSED, PAUSED_NEW, PAUSED_ALL = 0, 1, 2
"""vLLM's ``PauseState`` values (an ``IntEnum``; absent before pausing existed)."""

_STREAMING = getattr(RequestStatus, "WAITING_FOR_STREAMING_REQ", None)
"""The status of a streaming session waiting for input (absent before streaming input)."""


def pause_state(scheduler: Any) -> int:
    return int(getattr(scheduler, "_pause_state", UNPAUSED))


def admitting_queues(scheduler: Any, state: int | None = None) -> list[Any]:
    """The waiting queues vLLM's loop drains this step, in order: requests holding KV
    blocks first (the only ones admitted under ``PAUSED_NEW``), then the rest; none when
    everything is paused. ``state``: the pause state, when the caller has read it."""
    if state is None:
        state = pause_state(scheduler)
    if state == PAUSED_ALL:
        return []
    queues = [scheduler.kv_holding_waiting]
    if state == UNPAUSED:
        queues.append(scheduler.waiting)
    return queues


def is_blocked(scheduler: Any, request: Request) -> bool:
    """What ``Scheduler._handle_blocked_waiting_request`` would skip, without promoting."""
    status = request.status
    if status == RequestStatus.WAITING_FOR_REMOTE_KVS:
        return request.request_id not in getattr(scheduler, "finished_recving_kv_req_ids", ())
    if status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
        grammar_request = request.structured_output_request
        grammar = grammar_request.grammar if grammar_request is not None else None
        return grammar is None or isinstance(grammar, Exception)
    return _STREAMING is not None and status == _STREAMING


def has_stale_output(request: Request) -> bool:
    """Deliverable output still in flight: vLLM resumes such a request only later."""
    return bool(getattr(request, "num_stale_output_tokens", 0)) and not getattr(
        request, "drop_stale_output", False)


class LoraSlots:
    """vLLM's ``max_loras`` rule: a waiting request whose adapter would be one LoRA too
    many in this batch is skipped. Admissions are assumed to succeed as the plan meets
    them (the plan only looks as far as the budget reaches)."""

    def __init__(self, limit: int = 0, in_use: set[int] | None = None) -> None:
        """``limit`` 0: no LoRA limit, every request is admitted."""
        self.limit = limit
        self.in_use: set[int] = in_use if in_use is not None else set()

    @classmethod
    def of(cls, scheduler: Any) -> LoraSlots:
        """The step's bookkeeping; without LoRA one shared instance that admits all and
        never changes (the plan's check asks for one every step)."""
        config = scheduler.lora_config
        if not config or not config.max_loras:
            return _NO_LORAS
        return cls(config.max_loras, {r.lora_request.lora_int_id for r in scheduler.running
                                      if r.lora_request and r.lora_request.lora_int_id > 0})

    def admits(self, request: Request) -> bool:
        lora = request.lora_request
        if not self.limit or not lora:
            return True
        if lora.lora_int_id in self.in_use:
            return True
        if len(self.in_use) >= self.limit:
            return False
        if lora.lora_int_id > 0:
            self.in_use.add(lora.lora_int_id)
        return True


_NO_LORAS = LoraSlots()


def admissible(scheduler: Any, request: Request, loras: LoraSlots) -> bool:
    """Whether vLLM's loop would try to admit ``request`` when it meets it; ``loras`` is
    the step's LoRA bookkeeping, shared by the queues of one step. A predicate, not a
    filtering generator: the plan asks it once per waiting request it looks at, every
    step, and a generator layer costs as much as the checks."""
    return (not is_blocked(scheduler, request) and not has_stale_output(request)
            and loras.admits(request))


def free_running_slots(scheduler: Any) -> int:
    """Requests vLLM may still admit: paused streaming sessions keep a slot."""
    waiting_for_input = getattr(scheduler, "num_waiting_for_streaming_input", 0)
    return scheduler.max_num_active_reqs - len(scheduler.running) - waiting_for_input
