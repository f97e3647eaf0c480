"""Stand-in token ids for requests whose prompts are only counts: the simulator feeds
them to vLLM's scheduler and cache, and ``bench`` sends them to a real server, so both
see the same prompts.

A request's tokens are those of its named blocks (``WorkloadRequest.blocks``) where it
has them, so equal names are equal tokens and a prefix cache hits on them as on real
shared prefixes; elsewhere they derive from the request's id, so no two requests share
anything by accident. The ids lie in 2..``VOCAB`` + 1, within any model's vocabulary
(the project's tiny model has 8,192 tokens).
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from .case_files import WorkloadRequest

VOCAB = 997
"""Stand-in token ids are 2..VOCAB+1."""


def sequence(name: str, start: int, count: int) -> list[int]:
    """Tokens ``start`` to ``start + count`` of a pseudo-random sequence named ``name``
    (splitmix64 of a 64-bit seed plus the position): two names give different sequences
    at every offset, so no 16 tokens of one repeat another's and the prefix cache finds
    no false sharing."""
    seed = _seed(name)
    if count <= 32:  # a sampled token: numpy's per-call cost would dominate
        return [_mix((seed + i) & _MASK) % VOCAB + 2 for i in range(start, start + count)]
    with np.errstate(over="ignore"):
        z = np.arange(start, start + count, dtype=np.uint64) + np.uint64(seed)
        z += np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
        z ^= z >> np.uint64(31)
    return (z % np.uint64(VOCAB) + np.uint64(2)).tolist()


_MASK, _GOLDEN, _M1, _M2 = (1 << 64) - 1, 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


@functools.lru_cache(maxsize=1 << 16)
def _seed(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def _mix(x: int) -> int:
    """splitmix64's output function, as the numpy path computes it."""
    z = (x + _GOLDEN) & _MASK
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def token_ids(case: WorkloadRequest, start: int, count: int) -> list[int]:
    """Deterministic stand-in ids of the case's tokens ``start`` to ``start + count`` (its
    prompt, then its answer): those of its named blocks where it has them (equal names,
    equal tokens: the prefix cache hits on them as on real shared prefixes), else derived
    from its id (distinct per request, so a prefix cache finds no false sharing)."""
    size, blocks = case.block_tokens, case.blocks
    if not blocks:
        return sequence(case.id, start, count)
    ids: list[int] = []
    position, end = start, start + count
    while position < end:
        block, offset = divmod(position, size)
        take = min(size - offset, end - position)
        ids += (sequence(blocks[block], offset, take) if block < len(blocks)
                else sequence(case.id, position, take))
        position += take
    return ids


def prompt_token_ids(case: WorkloadRequest) -> list[int]:
    """The stand-in ids of the case's prompt (:func:`token_ids`)."""
    return token_ids(case, 0, case.prompt_tokens)
