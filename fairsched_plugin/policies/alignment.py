"""Chunk-end alignment to the KV block size (seed 000; automatic on Ascend NPUs, whose
block size is 128): a chunk that does not finish its prompt ends on a block boundary."""

from __future__ import annotations


def align_chunk(computed: int, chunk: int, remaining: int, block_size: int) -> int:
    """``chunk`` shortened so that ``computed + chunk`` is a multiple of ``block_size``,
    unless it is the prompt's final chunk; may return 0 when no boundary is in reach."""
    if chunk >= remaining or block_size <= 1:
        return chunk
    end = computed + chunk
    return max(end - end % block_size - computed, 0)
