"""Holding back decodes while prefill work waits (the ``decode_share`` switch).

Why it exists: with a token budget that is small against the decode batch, every decode
token is a prefill token the queue does not get. A shortest-first order admits short
prompts early, so more requests decode while others still queue, the prefill rate that
drains the queue falls, and the requests at the end of a busy period (P99's) wait longer
than under FCFS (benchmarks/results/2026-12-01-frontier-cpu-sim). Keeping the decodes to a share of the
budget while prefill work waits holds that prefill rate, at the price of slower decoding
for the newest requests during busy periods.

The newest decodes are the ones held back, as vLLM preempts the newest first: older
requests keep finishing, which frees their slots and KV blocks soonest. A decode is held
only when the prefill work waiting would take its budget, and at least one decode always
runs, so generation never stops.

Newest-first puts the whole wait on a few requests: their streams stall for as long as a
queue lasts. A TPOT bound (``decode_share_max_tpot_ms``) caps it where the user says: a
decode whose time per output token since its first decode step has reached the bound is
not held; the next older one beyond the share that has not is held in its place, and when
none is left the hold shrinks (the decodes within the share are never held).
"""

from __future__ import annotations


def decode_cap(share: float, token_budget: int, tokens_per_decode: int) -> int:
    """The decodes a step serves while prefill work waits: ``share`` of the budget, in
    decodes of ``tokens_per_decode`` tokens (1 plus speculative tokens), at least one."""
    return max(int(share * token_budget) // tokens_per_decode, 1)


def decodes_to_hold(num_decodes: int, tokens_per_decode: int, prefill_work: int,
                    token_budget: int, cap: int) -> int:
    """How many of the newest decodes to hold back this step.

    ``prefill_work``: the prefill tokens this step could schedule besides the decodes
    (running prefills' remaining work and the waiting requests vLLM can admit). Decodes
    beyond ``cap`` are held only as far as that work would use their budget."""
    if num_decodes <= cap:
        return 0
    room = token_budget - num_decodes * tokens_per_decode
    wanted = min(prefill_work, token_budget - cap * tokens_per_decode)
    if wanted <= room:
        return 0
    return min(num_decodes - cap, -(-(wanted - room) // tokens_per_decode))


def newest_within_tpot(decode_times: list[tuple[float, int]], hold: int,
                       max_tpot_s: float) -> list[int]:
    """The decodes to hold under a TPOT bound: indices into ``decode_times``, the
    holdable decodes oldest first as ``(seconds since the first decode step, tokens
    generated since)``, newest first and at most ``hold`` of them, leaving out each one
    whose time per token so far has reached ``max_tpot_s`` (a decode with no token yet
    counts as one token, so a new decode may wait one bound's length)."""
    chosen: list[int] = []
    for index in range(len(decode_times) - 1, -1, -1):
        if len(chosen) == hold:
            break
        elapsed, tokens = decode_times[index]
        if elapsed < max_tpot_s * max(tokens, 1):
            chosen.append(index)
    return chosen
