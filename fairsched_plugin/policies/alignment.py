"""Chunk-end alignment to the KV block size (the chunked-prefill paper; automatic on Ascend NPUs,
whose block size is 128): a chunk that does not finish its prompt ends on a block boundary."""

from __future__ import annotations


def align_chunk(computed: int, chunk: int, remaining: int, block_size: int) -> int:
    """``chunk`` shortened so that ``computed + chunk`` is a multiple of ``block_size``,
    unless it is the prompt's final chunk; may return 0 when no boundary is in reach."""
    if chunk >= remaining or block_size <= 1:
        return chunk
    end = computed + chunk
    return max(end - end % block_size - computed, 0)


def align_up(computed: int, chunk: int, remaining: int, bound: int, block_size: int) -> int:
    """A chunk that must be taken (an empty batch's only prefill, APC's warm start or forced
    progress), grown to the next block boundary or the prompt's end when ``bound`` reaches
    it, else shortened to the last boundary within it; as it is when neither exists."""
    if chunk >= remaining or block_size <= 1:
        return chunk
    end = computed + chunk
    up = min(-(-end // block_size) * block_size - computed, remaining)
    if up <= bound:
        return up
    return align_chunk(computed, chunk, remaining, block_size) or chunk
