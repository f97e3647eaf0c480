"""The latency predictor's 16 features: the one definition profiling, training and
serving share (the chunked-prefill paper, section 3.2.1, Tables 1 and 2).

The 11 raw features, in Table 1's order, describe one scheduled batch:

=============================  ======  ===================================================
feature                        unit    meaning here
=============================  ======  ===================================================
prefill_tokens                 tokens  prompt tokens this step computes (sum of the chunks)
decode_tokens                  tokens  tokens of decode requests this step: one per decode
                                       without speculation, 1 + k with k speculative tokens
batch_request_count            reqs    requests in the batch, prefills and decodes
sum_decode_context_len         tokens  sum over decode requests of their computed context
                                       (tokens already in the KV cache before this step)
max_decode_context_len         tokens  the largest such context among decode requests
prefill_processed_tokens       tokens  sum over prefill requests of the prompt tokens
                                       already computed before this step's chunk
max_prefill_processed_tokens   tokens  the largest such count among prefill requests
gpu_mem_used_mb                MiB     device memory in use (see ``memory``: the provider
gpu_mem_free_mb                MiB     decides what the four memory features measure, and
cuda_allocated_mb              MiB     a model records which provider it was trained on)
cuda_reserved_mb               MiB
=============================  ======  ===================================================

The five derived features of Table 2 follow them, computed here and nowhere else:
``bias`` = 1; ``scheduled_tokens`` = decode_tokens + prefill_tokens; ``avg_decode_ctx`` =
sum_decode_context_len / max(decode_tokens, 1); ``decode_ctx_interaction`` =
decode_tokens * avg_decode_ctx; ``prefill_interaction`` = prefill_tokens *
prefill_processed_tokens. Note that Table 2 divides by decode *tokens*, not decode
requests; with speculation the two differ, and the definition is kept as the paper has it.

Only numpy is imported: the scheduler calls :func:`raw_vector` and :class:`StepRows`
every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RAW_FEATURES: tuple[str, ...] = (
    "prefill_tokens",
    "decode_tokens",
    "batch_request_count",
    "sum_decode_context_len",
    "max_decode_context_len",
    "prefill_processed_tokens",
    "max_prefill_processed_tokens",
    "gpu_mem_used_mb",
    "gpu_mem_free_mb",
    "cuda_allocated_mb",
    "cuda_reserved_mb",
)
DERIVED_FEATURES: tuple[str, ...] = (
    "bias",
    "scheduled_tokens",
    "avg_decode_ctx",
    "decode_ctx_interaction",
    "prefill_interaction",
)
FEATURE_NAMES: tuple[str, ...] = RAW_FEATURES + DERIVED_FEATURES
FEATURE_UNITS: dict[str, str] = {
    "prefill_tokens": "tokens",
    "decode_tokens": "tokens",
    "batch_request_count": "requests",
    "sum_decode_context_len": "tokens",
    "max_decode_context_len": "tokens",
    "prefill_processed_tokens": "tokens",
    "max_prefill_processed_tokens": "tokens",
    "gpu_mem_used_mb": "MiB",
    "gpu_mem_free_mb": "MiB",
    "cuda_allocated_mb": "MiB",
    "cuda_reserved_mb": "MiB",
    "bias": "1",
    "scheduled_tokens": "tokens",
    "avg_decode_ctx": "tokens",
    "decode_ctx_interaction": "tokens^2",
    "prefill_interaction": "tokens^2",
}
NUM_RAW = len(RAW_FEATURES)
NUM_FEATURES = len(FEATURE_NAMES)

_PREFILL, _DECODE, _COUNT, _SUM_CTX, _MAX_CTX, _PROCESSED, _MAX_PROCESSED = range(7)
_SCHEDULED = FEATURE_NAMES.index("scheduled_tokens")
_INTERACTION = FEATURE_NAMES.index("prefill_interaction")
_VARYING = [_PREFILL, _COUNT, _PROCESSED, _MAX_PROCESSED, _SCHEDULED]
"""The columns that differ between a step's candidates (before the chunk is added)."""


@dataclass(slots=True)
class BatchStats:
    """The seven batch features, accumulated request by request while a batch is built."""

    prefill_tokens: int = 0
    decode_tokens: int = 0
    batch_request_count: int = 0
    sum_decode_context_len: int = 0
    max_decode_context_len: int = 0
    prefill_processed_tokens: int = 0
    max_prefill_processed_tokens: int = 0

    def add_decode(self, context_len: int, tokens: int = 1) -> None:
        """A decode request with ``context_len`` computed tokens, scheduling ``tokens``
        (1, or 1 + its speculative tokens)."""
        self.decode_tokens += tokens
        self.batch_request_count += 1
        self.sum_decode_context_len += context_len
        self.max_decode_context_len = max(self.max_decode_context_len, context_len)

    def add_prefill(self, chunk: int, processed: int) -> None:
        """A prefill request computing ``chunk`` prompt tokens, ``processed`` of its prompt
        already computed before this chunk."""
        self.prefill_tokens += chunk
        self.batch_request_count += 1
        self.prefill_processed_tokens += processed
        self.max_prefill_processed_tokens = max(self.max_prefill_processed_tokens, processed)


@dataclass(frozen=True, slots=True)
class MemoryState:
    """The four memory features, in MiB (2**20 bytes), as a memory provider reads them."""

    used_mb: float
    free_mb: float
    allocated_mb: float
    reserved_mb: float


def raw_vector(stats: BatchStats, memory: MemoryState) -> np.ndarray:
    """The 11 raw features of one batch, float32, in ``RAW_FEATURES`` order."""
    return np.array(
        (
            stats.prefill_tokens,
            stats.decode_tokens,
            stats.batch_request_count,
            stats.sum_decode_context_len,
            stats.max_decode_context_len,
            stats.prefill_processed_tokens,
            stats.max_prefill_processed_tokens,
            memory.used_mb,
            memory.free_mb,
            memory.allocated_mb,
            memory.reserved_mb,
        ),
        dtype=np.float32,
    )


def feature_matrix(raw: np.ndarray) -> np.ndarray:
    """Rows of 11 raw features -> rows of all 16 (raw, then Table 2's derived), float32."""
    raw = np.asarray(raw)
    if raw.ndim != 2 or raw.shape[1] != NUM_RAW:
        raise ValueError(
            f"feature_matrix needs rows of the {NUM_RAW} raw features {RAW_FEATURES}, "
            f"got an array of shape {raw.shape}"
        )
    out = np.empty((raw.shape[0], NUM_FEATURES), dtype=np.float32)
    out[:, :NUM_RAW] = raw
    # Derived values in float64: products of token counts outgrow float32's exact range.
    prefill = raw[:, _PREFILL].astype(np.float64)
    decode = raw[:, _DECODE].astype(np.float64)
    avg_ctx = raw[:, _SUM_CTX] / np.maximum(decode, 1.0)
    out[:, NUM_RAW] = 1.0
    out[:, NUM_RAW + 1] = decode + prefill
    out[:, NUM_RAW + 2] = avg_ctx
    out[:, NUM_RAW + 3] = decode * avg_ctx
    out[:, NUM_RAW + 4] = prefill * raw[:, _PROCESSED]
    return out


def feature_ranges(rows: np.ndarray) -> dict[str, list[float]]:
    """``{feature: [minimum, maximum]}`` over 16-feature ``rows`` (a training split): what
    a model records so that serving can clamp inputs into what it was trained on."""
    low, high = rows.min(axis=0), rows.max(axis=0)
    return {name: [float(low[i]), float(high[i])] for i, name in enumerate(FEATURE_NAMES)}


def batch_row(stats: BatchStats, memory: MemoryState) -> np.ndarray:
    """All 16 features of one batch, shape (16,): ``feature_matrix`` of its raw vector,
    computed with Python floats, a few times faster than numpy's per-column calls for the
    one row the scheduler needs at a time (the tests check the two are equal)."""
    raw = raw_vector(stats, memory)
    prefill = float(raw[_PREFILL])
    decode = float(raw[_DECODE])
    avg_ctx = float(raw[_SUM_CTX]) / max(decode, 1.0)
    out = np.empty(NUM_FEATURES, dtype=np.float32)
    out[:NUM_RAW] = raw
    out[NUM_RAW:] = (1.0, decode + prefill, avg_ctx, decode * avg_ctx,
                     prefill * float(raw[_PROCESSED]))
    return out


class StepRows:
    """The 16-feature rows LPRS scores within one step, many candidates per predictor call.

    A step's decodes and memory state are fixed while its prefills are chosen, so their
    columns (and the decode-derived ones) are computed once, here; each candidate's rows
    then differ only in the prefill columns. Equal to ``feature_matrix`` of the grown
    batches' raw vectors as long as token counts stay below 2**24, where float32 holds
    integers exactly (the tests check it).
    """

    def __init__(self, batch: BatchStats, memory: MemoryState) -> None:
        """``batch``: this step's batch; only its decodes count, the prefill columns are
        set row by row."""
        self._template = batch_row(batch, memory)
        self._decode_tokens = batch.decode_tokens

    def rows(
        self, batch: BatchStats, candidates: Sequence[tuple[int, int, np.ndarray]]
    ) -> np.ndarray:
        """Rows for a run of prefill candidates in the order they join the batch.

        ``candidates[k]`` is ``(processed, joins, chunks)``: candidate k has ``processed``
        prompt tokens computed; its rows are the batch ``batch`` (this step's decodes plus
        the prefills chosen so far) grown by the ``joins`` chunks of candidates 0..k-1 (0:
        not in the batch) and by one prefill of candidate k, one row per size in
        ``chunks`` (empty: no rows for it). Rows of all candidates, concatenated in order.
        """
        prefill = batch.prefill_tokens
        count = batch.batch_request_count
        processed_sum = batch.prefill_processed_tokens
        processed_max = batch.max_prefill_processed_tokens
        heads: list[tuple[int, int, int, int, int]] = []
        sets: list[np.ndarray] = []
        for processed, joins, chunks in candidates:
            if len(chunks):
                heads.append((prefill, count + 1, processed_sum + processed,
                              max(processed_max, processed), self._decode_tokens + prefill))
                sets.append(chunks)
            if joins > 0:
                prefill += joins
                count += 1
                processed_sum += processed
                processed_max = max(processed_max, processed)
        if len(sets) == 1:
            head = self._template.copy()
            head[_VARYING] = heads[0]
            out = np.empty((len(sets[0]), NUM_FEATURES), dtype=np.float32)
            out[:] = head
            chunks = sets[0].astype(np.float32)
        else:
            per_candidate = np.empty((len(heads), NUM_FEATURES), dtype=np.float32)
            per_candidate[:] = self._template
            per_candidate[:, _VARYING] = heads
            out = per_candidate.repeat([len(c) for c in sets], axis=0)
            chunks = np.concatenate(sets).astype(np.float32)
        out[:, _PREFILL] += chunks
        out[:, _SCHEDULED] += chunks
        # float32 products of float32 integers round once, like feature_matrix's float64.
        np.multiply(out[:, _PREFILL], out[:, _PROCESSED], out=out[:, _INTERACTION])
        return out
