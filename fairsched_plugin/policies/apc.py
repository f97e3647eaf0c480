"""APC, active prefill control (the chunked-prefill paper's §3.3, Eq. 12-14), and a deferral
bound.

Per step: a dynamic cap on how many prefills may be active in the batch (Eq. 12), a
minimum useful chunk per prefill (Eq. 13), and the decision on each proposed chunk
(Eq. 14): accept it, warm-start a prefill when none is active, or hold it back. Held
back too long (``max_deferred_steps`` considered steps in a row), a prefill is forced
to make minimum progress, so APC itself never starves anything.

The cap counts the prefills the step leaves unfinished (the paper's "active, incomplete
prefill requests"): a chunk that finishes its prompt is accepted whatever the count and
does not add to it, since it fragments nothing and leaves the active set with this step;
counting it would hold short prompts back in bursts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .alignment import align_up


class Outcome(str, Enum):
    ACCEPTED = "accepted"
    WARM_START = "warm_start"
    BLOCKED_BY_CAP = "blocked_by_cap"
    BLOCKED_BY_MIN_CHUNK = "blocked_by_min_chunk"
    FORCED = "forced"


_NO_COUNTS = {o.value: 0 for o in Outcome}


def activity_cap(
    max_active: int, max_seqs: int, num_decodes: int, token_budget: int, committed: int,
    min_chunk: int,
) -> int:
    """Eq. 12: ``C_t = min(C_max, S_max - |D_t|, floor((B_max - U_t) / L_min))``."""
    return max(min(max_active, max_seqs - num_decodes, (token_budget - committed) // min_chunk), 0)


def min_progress(remaining: int, min_chunk: int) -> int:
    """Eq. 13: ``m_i = min(r_i, L_min)``."""
    return min(remaining, min_chunk)


def decide(proposed: int, bound: int, remaining: int, active: int, cap: int,
           min_chunk: int, started: bool) -> tuple[int, Outcome]:
    """Eq. 14 for one prefill: ``proposed`` is LPRS's (or the budget rule's) chunk,
    ``bound`` the feasible ``h``, ``active`` the unfinished prefills already in this
    batch, ``started`` whether it has any prefill (the warm start is for a batch with
    none). A chunk that finishes the prompt is accepted whatever ``active`` is."""
    m = min_progress(remaining, min_chunk)
    if proposed >= m and (active < cap or proposed >= remaining):
        return proposed, Outcome.ACCEPTED
    if proposed < m and not started:
        return min(bound, m), Outcome.WARM_START
    if proposed >= m:
        return 0, Outcome.BLOCKED_BY_CAP
    return 0, Outcome.BLOCKED_BY_MIN_CHUNK


@dataclass
class ActivePrefillControl:
    """Eq. 12-14 across steps: the step's cap, the batch's active count, per-request
    deferral streaks and counters for the trace."""

    max_active: int
    min_chunk: int
    max_deferred_steps: int
    cap: int = 0
    active: int = 0
    started: bool = False
    deferred: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: dict(_NO_COUNTS))
    block_size: int = 1
    """The KV block size chunk ends align to (``lprs.align``); 1: no alignment."""

    def begin_step(self, max_seqs: int, num_decodes: int, token_budget: int,
                   committed: int) -> None:
        self.cap = activity_cap(self.max_active, max_seqs, num_decodes, token_budget,
                                committed, self.min_chunk)
        self.active = 0
        self.started = False
        self.counts = dict(_NO_COUNTS)

    def holds_back(self, request_id: str, can_finish: bool, active: int | None = None) -> bool:
        """True when this prefill gets 0 whatever chunk is proposed (the batch already has
        ``cap`` unfinished prefills, it is not due to be forced, and its bound cannot
        finish it: ``can_finish`` False), so the caller can skip working out a proposal.
        ``active``: the batch's unfinished prefills if not the current count (a caller
        looking ahead at batches not yet built)."""
        return (
            not can_finish
            and 0 < self.cap <= (self.active if active is None else active)
            and self.deferred.get(request_id, 0) < self.max_deferred_steps
        )

    def would_choose(self, request_id: str, proposed: int, bound: int, remaining: int,
                     active: int, started: bool, computed: int = 0) -> int:
        """The chunk :meth:`choose` would give with ``active`` unfinished prefills in the
        batch (and any prefill at all: ``started``), recording nothing: what a caller
        looking ahead assumes."""
        return self._decide(request_id, proposed, bound, remaining, active, started,
                            computed)[0]

    def choose(self, request_id: str, proposed: int, bound: int, remaining: int,
               computed: int = 0) -> int:
        """The chunk this prefill gets (0: held back this step); ``computed`` is how much
        of its prompt is already computed (where a chunk APC sets ends on a block)."""
        chunk, outcome = self._decide(request_id, proposed, bound, remaining, self.active,
                                      self.started, computed)
        self.counts[outcome.value] += 1
        if chunk > 0:
            self.active += chunk < remaining
            self.started = True
            self.deferred.pop(request_id, None)
        else:
            self.deferred[request_id] = self.deferred.get(request_id, 0) + 1
        return chunk

    def _decide(self, request_id: str, proposed: int, bound: int, remaining: int,
                active: int, started: bool, computed: int) -> tuple[int, Outcome]:
        """Eq. 14 with the deferral bound, for a batch with ``active`` unfinished
        prefills. A chunk APC sets itself (warm start, forced progress) ends on a KV block
        boundary when alignment is on and the bound reaches one."""
        chunk, outcome = decide(proposed, bound, remaining, active, self.cap, self.min_chunk,
                                started)
        if chunk == 0 and bound >= 1 and self.deferred.get(request_id, 0) >= self.max_deferred_steps:
            chunk = max(proposed, min(bound, min_progress(remaining, self.min_chunk)))
            outcome = Outcome.FORCED
        if outcome in (Outcome.WARM_START, Outcome.FORCED):
            chunk = align_up(computed, chunk, remaining, bound, self.block_size)
        return chunk, outcome

    def forget(self, request_id: str) -> None:
        """The request left the engine: drop its streak."""
        self.deferred.pop(request_id, None)
