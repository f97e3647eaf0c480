"""The named synthetic workloads: arrival processes, parameters, generators and the
``WORKLOADS`` registry.

Every named workload is a seeded generator over a ShareGPT pair pool
(``fairsched_plugin.experiment.pairs``) that returns a case (``experiment.case_files``: one
``WorkloadRequest`` per request, with its arrival offset, prompt and target output
length): the same pool and seed give the identical case, so every policy in a comparison
sees the same traffic. The ``fairsched workload`` verbs that build and write cases are
in ``experiment.workload_cli``; production traces are in ``experiment.traces``.

Workloads (defaults sized for one GPU serving a small model; ``WORKLOADS`` holds them):

=======================  =====  ===========================================  ====================
name                     reqs   arrivals (rates in req/s)                    prompt classes
=======================  =====  ===========================================  ====================
steady_short             500    Poisson 20                                   short 1.0
steady_mixed             500    Poisson 10                                   short .6 medium .3
                                                                             long .1
bursty_conversational    500    clusters: starts Poisson 1, 5-20 requests,   short .7 medium .3
                                exponential spacing, mean 0.02 s
bursty_long              300    clusters: starts Poisson 0.5, 4-12 requests, long .6 medium .3
                                exponential spacing, mean 0.05 s             short .1
flash_crowd              500    Poisson 5 background (60 %) plus 1 spike:    short .6 medium .3
                                40 % of requests uniform within 2 s, placed  long .1
                                at the middle of the background span
low_load                 100    Poisson 1                                    as in the pool
short_long_mix           400    Poisson 8                                    short .8 long .2
uniform                  500    Poisson 10                                   as in the pool
sharegpt_fixed_gap       200    fixed gap 0.1 s                              as in the pool
apc_mix                  1000   Poisson in phases: 25 % at 10, 50 % at 40,   49 short (30-50
                                25 % at 10                                   tokens) : 1 long
                                                                             (200-220 tokens)
multi_turn               300    conversations start Poisson 2; each next     each turn resends
                                turn 3 s after the previous one              its history
=======================  =====  ===========================================  ====================

The first eight are the ordering-policies paper's categories (section 5.1: steady short, steady
mixed, bursty conversational, bursty long, flash crowd, low load, short/long mix, uniform
baseline; Poisson arrivals have exponential gaps, bursty ones are clusters with
random spacing inside). The last two are the chunked-prefill paper's (section 4.1): ShareGPT at a
fixed
0.1 s gap (100 or 200 requests for Aging; 1,000 requests at 0.1 s and 1.0 s for LPRS:
``rate_scale=0.1`` turns 0.1 s into 1.0 s) and the APC ablation mix, whose paper gives
only the 49:1 ratio, the two length ranges and "an arrival rate that changes"; the
phases above are this project's choice. ``multi_turn`` is this project's, for prefix
caching: ShareGPT conversations whose turn ``k`` prompt is the conversation up to its
``k``-th user turn (user and assistant turns, from the packaged ShareGPT file the pool
was built from), so each turn resends its history and vLLM's prefix cache holds most of
it. Conversations are drawn in random order, each with its turns until its
history would pass ``max_history_tokens``, until ``num_requests`` turns are drawn.

Details that hold for every workload:

- The first request arrives at 0 s; requests are ordered by arrival and named
  ``<workload>-s<seed>-<index>``.
- A class mix is split into exact counts (largest remainder), so ``short_long_mix``
  with 400 requests has exactly 320 short and 80 long prompts; "as in the pool" draws
  uniformly from all eligible pairs. Pairs are drawn without replacement, so a case
  never repeats a prompt (a repeat would be a prefix-cache hit, not a scheduling test).
- ``rate_scale`` multiplies every rate and divides every time constant (gaps, spacing
  inside clusters, spike windows): the timeline stretches by ``1 / rate_scale`` and the
  drawn prompts stay the same. Use about 0.1 for the tiny CPU engine.
- ``max_prompt_tokens`` / ``max_output_tokens`` leave pairs above the cap out of the
  draw, so lengths stay as ShareGPT has them (the chunked-prefill paper's Aging runs: 512 / 512).
- ``output_tokens`` is the pair's response length and ``prompt_tokens`` the pool's
  count, the BOS included (see ``experiment.case_files`` for what the replay does with them).
- ``apc_mix`` prompts are ShareGPT prompts cut, with the served tokenizer, to a
  length drawn uniformly from the range, verified by re-encoding. Long requests are
  ``round(n / 50)`` of ``n``, placed at random. Output lengths are drawn from the
  pool's response lengths that lie within 32-128 tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from ..sharegpt import iter_conversations
from .case_files import WorkloadRequest
from .pairs import (
    REQUEST_CLASSES,
    Pair,
    PairPool,
    cut_to_tokens,
    load_tokenizer,
)


# ------------------------------------------------------------------- arrival processes


def poisson_arrivals(n: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times of a Poisson process (exponential gaps), the first at 0."""
    gaps = rng.exponential(1.0 / rate_per_s, size=max(n - 1, 0))
    return np.concatenate([[0.0], np.cumsum(gaps)])[:n]


def fixed_gap_arrivals(n: int, gap_s: float) -> np.ndarray:
    """``n`` arrivals exactly ``gap_s`` apart, the first at 0."""
    return np.arange(n) * gap_s


def clustered_arrivals(
    n: int,
    cluster_rate_per_s: float,
    cluster_size: tuple[int, int],
    spacing_s: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Bursts: cluster starts are Poisson, each cluster holds a uniform number of
    requests in ``cluster_size`` (inclusive; the last one is cut to reach ``n``) spaced
    by exponential gaps of mean ``spacing_s``. Sorted, since clusters may overlap."""
    sizes: list[int] = []
    while sum(sizes) < n:
        sizes.append(int(rng.integers(cluster_size[0], cluster_size[1] + 1)))
    sizes[-1] -= sum(sizes) - n
    starts = poisson_arrivals(len(sizes), cluster_rate_per_s, rng)
    times = [
        start + np.concatenate([[0.0], np.cumsum(rng.exponential(spacing_s, size - 1))])
        for start, size in zip(starts, sizes)
    ]
    return np.sort(np.concatenate(times))


def flash_crowd_arrivals(
    n_background: int,
    background_rate_per_s: float,
    spike_sizes: Sequence[int],
    spike_window_s: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Poisson background plus spikes of near-simultaneous arrivals.

    Spike ``k`` of ``K`` starts at ``(k + 1) / (K + 1)`` of the background's span and
    spreads its requests uniformly over ``spike_window_s``.
    """
    background = poisson_arrivals(n_background, background_rate_per_s, rng)
    span = background[-1] if n_background else 0.0
    spikes = [
        span * (k + 1) / (len(spike_sizes) + 1) + rng.uniform(0.0, spike_window_s, size)
        for k, size in enumerate(spike_sizes)
    ]
    return np.sort(np.concatenate([background, *spikes]))


def phased_poisson_arrivals(
    counts: Sequence[int], rates_per_s: Sequence[float], rng: np.random.Generator
) -> np.ndarray:
    """Poisson arrivals whose rate changes between phases: phase ``i`` has
    ``counts[i]`` requests at ``rates_per_s[i]`` and starts one exponential gap (at the
    new rate) after the previous phase's last arrival."""
    times: list[np.ndarray] = []
    end = 0.0
    for count, rate in zip(counts, rates_per_s):
        if count == 0:
            continue
        phase = poisson_arrivals(count, rate, rng)
        if times:
            phase = phase + end + rng.exponential(1.0 / rate)
        times.append(phase)
        end = float(phase[-1])
    return np.concatenate(times) if times else np.zeros(0)


# ------------------------------------------------------------------------- parameters

ClassMix = Mapping[str, float] | None
"""Weights per prompt class (exact counts by largest remainder); None: as in the pool."""


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")


def _freeze_mix(params: PoissonParams | BurstyParams | FlashCrowdParams) -> None:
    """Validate ``params.class_mix`` and make it read-only (frozen dataclass)."""
    mix = params.class_mix
    if mix is None:
        return
    unknown = set(mix) - set(REQUEST_CLASSES)
    if unknown or any(w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError(
            f"class_mix must weigh {', '.join(REQUEST_CLASSES)} with non-negative weights, "
            f"not all zero; got {dict(mix)!r}"
        )
    object.__setattr__(params, "class_mix", MappingProxyType(dict(mix)))


@dataclass(frozen=True)
class PoissonParams:
    """Steady traffic: Poisson arrivals at one rate (steady_*, low_load, short_long_mix,
    uniform)."""

    num_requests: int
    rate_per_s: float
    class_mix: ClassMix

    def __post_init__(self) -> None:
        _positive("num_requests", self.num_requests)
        _positive("rate_per_s", self.rate_per_s)
        _freeze_mix(self)


@dataclass(frozen=True)
class BurstyParams:
    """Clustered arrivals: cluster starts Poisson at ``cluster_rate_per_s``; each
    cluster has ``cluster_size_min..max`` requests spaced by exponential gaps of mean
    ``spacing_s``."""

    num_requests: int
    cluster_rate_per_s: float
    cluster_size_min: int
    cluster_size_max: int
    spacing_s: float
    class_mix: ClassMix

    def __post_init__(self) -> None:
        _positive("num_requests", self.num_requests)
        _positive("cluster_rate_per_s", self.cluster_rate_per_s)
        _positive("cluster_size_min", self.cluster_size_min)
        _positive("spacing_s", self.spacing_s)
        if self.cluster_size_max < self.cluster_size_min:
            raise ValueError("cluster_size_max must be >= cluster_size_min")
        _freeze_mix(self)


@dataclass(frozen=True)
class FlashCrowdParams:
    """Poisson background plus ``num_spikes`` spikes that together hold
    ``spike_fraction`` of the requests, each spread over ``spike_window_s``."""

    num_requests: int
    background_rate_per_s: float
    num_spikes: int
    spike_fraction: float
    spike_window_s: float
    class_mix: ClassMix

    def __post_init__(self) -> None:
        _positive("num_requests", self.num_requests)
        _positive("background_rate_per_s", self.background_rate_per_s)
        _positive("num_spikes", self.num_spikes)
        _positive("spike_window_s", self.spike_window_s)
        if not 0 < self.spike_fraction < 1:
            raise ValueError("spike_fraction must be between 0 and 1 (exclusive)")
        _freeze_mix(self)


@dataclass(frozen=True)
class FixedGapParams:
    """Requests exactly ``gap_s`` apart, prompts drawn uniformly from the pool."""

    num_requests: int
    gap_s: float

    def __post_init__(self) -> None:
        _positive("num_requests", self.num_requests)
        _positive("gap_s", self.gap_s)


@dataclass(frozen=True)
class ApcMixParams:
    """The chunked-prefill paper's APC ablation mix: ``short_per_long`` short prompts per long one,
    with prompt lengths (tokens, inclusive) drawn uniformly from the two ranges, arriving in
    Poisson ``phases`` of (share of requests, rate req/s)."""

    num_requests: int
    short_tokens: tuple[int, int]
    long_tokens: tuple[int, int]
    short_per_long: int
    phases: tuple[tuple[float, float], ...]
    output_tokens: tuple[int, int]

    def __post_init__(self) -> None:
        # Overrides may come from JSON, where tuples are lists.
        for name in ("short_tokens", "long_tokens", "output_tokens"):
            value = tuple(getattr(self, name))
            if len(value) != 2 or not 2 <= value[0] <= value[1]:
                raise ValueError(f"{name} must be a (min, max) pair with 2 <= min <= max")
            object.__setattr__(self, name, value)
        phases = tuple((float(share), float(rate)) for share, rate in self.phases)
        if any(share < 0 or rate <= 0 for share, rate in phases) or sum(
            share for share, _ in phases
        ) <= 0:
            raise ValueError("phases must be (share >= 0, rate > 0) pairs, shares not all 0")
        object.__setattr__(self, "phases", phases)
        _positive("num_requests", self.num_requests)
        _positive("short_per_long", self.short_per_long)


@dataclass(frozen=True)
class MultiTurnParams:
    """Conversations starting at ``conversation_rate_per_s`` (Poisson), each turn
    ``turn_gap_s`` after the one before, at most ``max_turns`` turns and
    ``max_history_tokens`` prompt tokens per turn."""

    num_requests: int
    conversation_rate_per_s: float
    turn_gap_s: float
    max_turns: int
    max_history_tokens: int

    def __post_init__(self) -> None:
        for name in ("num_requests", "conversation_rate_per_s", "turn_gap_s", "max_turns",
                     "max_history_tokens"):
            _positive(name, getattr(self, name))


Params = (PoissonParams | BurstyParams | FlashCrowdParams | FixedGapParams | ApcMixParams
          | MultiTurnParams)

# ---------------------------------------------------------------------- pair sampling


def split_counts(n: int, weights: Sequence[float]) -> list[int]:
    """Split ``n`` into integer counts proportional to ``weights`` (largest remainder,
    ties to the earlier weight), so a mix is exact rather than sampled."""
    total = sum(weights)
    quotas = [n * w / total for w in weights]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda i: counts[i] - quotas[i])
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return counts


def draw_pairs(
    pairs: Sequence[Pair], n: int, class_mix: ClassMix, rng: np.random.Generator
) -> list[Pair]:
    """``n`` distinct pairs in random order, with exact class counts when a mix is given."""
    if class_mix is None:
        return _draw(pairs, n, rng, "eligible")
    drawn: list[Pair] = []
    for cls, count in zip(class_mix, split_counts(n, list(class_mix.values()))):
        candidates = [pair for pair in pairs if pair.request_class == cls]
        drawn += _draw(candidates, count, rng, cls)
    return [drawn[i] for i in rng.permutation(len(drawn))]


def _draw(pairs: Sequence[Pair], n: int, rng: np.random.Generator, what: str) -> list[Pair]:
    if n > len(pairs):
        raise ValueError(
            f"needs {n} {what} pairs but the pool has {len(pairs)} within the caps; "
            f"lower num_requests, raise the caps or build a bigger pool"
        )
    return [pairs[i] for i in rng.choice(len(pairs), size=n, replace=False)]


# ------------------------------------------------------------------------- generators

Generated = tuple[np.ndarray, list[Pair]]
"""Arrival times (unit rate scale, any order) and the pair of each arrival."""


def _generate_poisson(
    params: PoissonParams, pool: PairPool, rng: np.random.Generator
) -> Generated:
    arrivals = poisson_arrivals(params.num_requests, params.rate_per_s, rng)
    return arrivals, draw_pairs(pool.pairs, params.num_requests, params.class_mix, rng)


def _generate_bursty(
    params: BurstyParams, pool: PairPool, rng: np.random.Generator
) -> Generated:
    arrivals = clustered_arrivals(
        params.num_requests,
        params.cluster_rate_per_s,
        (params.cluster_size_min, params.cluster_size_max),
        params.spacing_s,
        rng,
    )
    return arrivals, draw_pairs(pool.pairs, params.num_requests, params.class_mix, rng)


def _generate_flash_crowd(
    params: FlashCrowdParams, pool: PairPool, rng: np.random.Generator
) -> Generated:
    in_spikes = round(params.num_requests * params.spike_fraction)
    spike_sizes = split_counts(in_spikes, [1.0] * params.num_spikes)
    arrivals = flash_crowd_arrivals(
        params.num_requests - in_spikes,
        params.background_rate_per_s,
        spike_sizes,
        params.spike_window_s,
        rng,
    )
    return arrivals, draw_pairs(pool.pairs, params.num_requests, params.class_mix, rng)


def _generate_fixed_gap(
    params: FixedGapParams, pool: PairPool, rng: np.random.Generator
) -> Generated:
    arrivals = fixed_gap_arrivals(params.num_requests, params.gap_s)
    return arrivals, draw_pairs(pool.pairs, params.num_requests, None, rng)


def _generate_apc_mix(
    params: ApcMixParams, pool: PairPool, rng: np.random.Generator
) -> Generated:
    n_long = round(params.num_requests / (params.short_per_long + 1))
    is_long = rng.permutation(np.arange(params.num_requests) < n_long)
    ranges = [params.long_tokens if long else params.short_tokens for long in is_long]
    targets = [int(rng.integers(lo, hi + 1)) for lo, hi in ranges]
    counts = split_counts(params.num_requests, [share for share, _ in params.phases])
    arrivals = phased_poisson_arrivals(counts, [rate for _, rate in params.phases], rng)
    outputs = _output_lengths(pool.pairs, params.output_tokens, params.num_requests, rng)
    tokenizer = load_tokenizer(pool.tokenizer)
    sources = {
        length_range: _shuffled_indices(pool.pairs, length_range[1], rng)
        for length_range in (params.long_tokens, params.short_tokens)
    }
    used: set[int] = set()
    cut: dict[int, Pair] = {}
    # Long prompts first: their sources are scarcer and also qualify as short sources.
    for i in sorted(range(params.num_requests), key=lambda i: not is_long[i]):
        source = _cut_pair(pool.pairs, sources[ranges[i]], used, targets[i], tokenizer)
        cut[i] = replace(source, output_tokens=outputs[i])
    return arrivals, [cut[i] for i in range(params.num_requests)]


def _generate_multi_turn(
    params: MultiTurnParams, pool: PairPool, rng: np.random.Generator
) -> Generated:
    turns_of: dict[int, list[Pair]] = {}
    for pair in pool.pairs:
        turns_of.setdefault(pair.conversation, []).append(pair)
    multi = {conv: sorted(turns, key=lambda p: p.turn) for conv, turns in turns_of.items()
             if len(turns) >= 2}
    raw = _raw_conversations(set(multi), pool.sharegpt)
    tokenizer = load_tokenizer(pool.tokenizer)
    order = sorted(multi)
    starts = iter(poisson_arrivals(len(order), params.conversation_rate_per_s, rng))
    requests: list[tuple[float, Pair]] = []
    for index in rng.permutation(len(order)):
        if len(requests) >= params.num_requests:
            break
        conversation = order[index]
        start = next(starts)
        for k, turn in enumerate(multi[conversation][:params.max_turns]):
            source = raw[conversation]
            if source[turn.turn].get("value") != turn.prompt:
                source_name = pool.sharegpt or "the packaged ShareGPT file"
                raise ValueError(f"conversation {conversation} of {source_name} is not the "
                                 "one the pool read")
            prompt = chat_history(source[:turn.turn + 1])
            tokens = len(tokenizer.encode(prompt).ids)
            if tokens > params.max_history_tokens or len(requests) >= params.num_requests:
                break
            requests.append((start + k * params.turn_gap_s,
                             replace(turn, prompt=prompt, prompt_tokens=tokens)))
    if len(requests) < params.num_requests:
        raise ValueError(f"only {len(requests)} turns fit; lower num_requests or raise "
                         "max_history_tokens")
    return np.array([t for t, _ in requests]), [pair for _, pair in requests]


def chat_history(turns: Sequence[Mapping[str, str]]) -> str:
    """A conversation up to and including its last (user) turn, as one prompt: what a
    chat client resends each turn."""
    names = {"human": "User", "gpt": "Assistant"}
    return "\n\n".join(f"{names.get(t.get('from', ''), 'User')}: {t.get('value', '')}"
                        for t in turns) + "\n\nAssistant:"


def _raw_conversations(wanted: set[int],
                       sharegpt: str | None) -> dict[int, list[dict[str, str]]]:
    """The ShareGPT file's conversations (the packaged one for None) at the indices
    pairs record."""
    found: dict[int, list[dict[str, str]]] = {}
    for index, turns in enumerate(iter_conversations(Path(sharegpt) if sharegpt else None)):
        if index in wanted:
            found[index] = turns
    return found


def _output_lengths(
    pairs: Sequence[Pair], bounds: tuple[int, int], n: int, rng: np.random.Generator
) -> list[int]:
    """``n`` response lengths drawn (with replacement) from the pool's responses within
    ``bounds``: real lengths, without tying them to a prompt that is cut anyway."""
    lengths = [p.output_tokens for p in pairs if bounds[0] <= p.output_tokens <= bounds[1]]
    if not lengths:
        raise ValueError(f"no response in the pool has {bounds[0]}-{bounds[1]} tokens")
    return [int(x) for x in rng.choice(lengths, size=n)]


def _shuffled_indices(
    pairs: Sequence[Pair], min_prompt_tokens: int, rng: np.random.Generator
) -> list[int]:
    """Indices of the pairs with at least ``min_prompt_tokens``, in random order."""
    indices = [i for i, pair in enumerate(pairs) if pair.prompt_tokens >= min_prompt_tokens]
    return [indices[j] for j in rng.permutation(len(indices))]


def _cut_pair(
    pairs: Sequence[Pair],
    sources: list[int],
    used: set[int],
    target: int,
    tokenizer: Tokenizer,
) -> Pair:
    """The next unused source whose prompt can be cut to exactly ``target`` tokens."""
    for index in sources:
        if index in used:
            continue
        source = pairs[index]
        prompt = cut_to_tokens(tokenizer, source.prompt, target)
        if prompt is None:
            continue
        used.add(index)
        return Pair(
            prompt, target, source.output_tokens, source.tier, source.conversation, source.turn
        )
    raise ValueError(
        f"too few unused pairs with a prompt of at least {target} tokens; "
        f"build a bigger pool or lower num_requests"
    )


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Workload:
    """A named workload: where it comes from, its default parameters, its generator."""

    name: str
    summary: str
    defaults: Params
    generate: Callable[[Any, PairPool, np.random.Generator], Generated]


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "steady_short",
            "ordering-policies paper: steady Poisson traffic of short prompts",
            PoissonParams(num_requests=500, rate_per_s=20.0, class_mix={"short": 1.0}),
            _generate_poisson,
        ),
        Workload(
            "steady_mixed",
            "ordering-policies paper: steady Poisson traffic, mostly short with medium and long "
            "prompts",
            PoissonParams(
                num_requests=500,
                rate_per_s=10.0,
                class_mix={"short": 0.6, "medium": 0.3, "long": 0.1},
            ),
            _generate_poisson,
        ),
        Workload(
            "bursty_conversational",
            "ordering-policies paper: bursts of short and medium (chat-like) prompts",
            BurstyParams(
                num_requests=500,
                cluster_rate_per_s=1.0,
                cluster_size_min=5,
                cluster_size_max=20,
                spacing_s=0.02,
                class_mix={"short": 0.7, "medium": 0.3},
            ),
            _generate_bursty,
        ),
        Workload(
            "bursty_long",
            "ordering-policies paper: bursts dominated by long prompts (head-of-line blocking)",
            BurstyParams(
                num_requests=300,
                cluster_rate_per_s=0.5,
                cluster_size_min=4,
                cluster_size_max=12,
                spacing_s=0.05,
                class_mix={"short": 0.1, "medium": 0.3, "long": 0.6},
            ),
            _generate_bursty,
        ),
        Workload(
            "flash_crowd",
            "ordering-policies paper: steady background and one sudden spike of near-simultaneous "
            "requests",
            FlashCrowdParams(
                num_requests=500,
                background_rate_per_s=5.0,
                num_spikes=1,
                spike_fraction=0.4,
                spike_window_s=2.0,
                class_mix={"short": 0.6, "medium": 0.3, "long": 0.1},
            ),
            _generate_flash_crowd,
        ),
        Workload(
            "low_load",
            "ordering-policies paper: low-rate Poisson traffic, prompts as in the pool",
            PoissonParams(num_requests=100, rate_per_s=1.0, class_mix=None),
            _generate_poisson,
        ),
        Workload(
            "short_long_mix",
            "ordering-policies paper: a fixed ratio of short and long prompts",
            PoissonParams(num_requests=400, rate_per_s=8.0, class_mix={"short": 0.8, "long": 0.2}),
            _generate_poisson,
        ),
        Workload(
            "uniform",
            "ordering-policies paper: baseline, prompts uniformly from the whole pool at a steady "
            "rate",
            PoissonParams(num_requests=500, rate_per_s=10.0, class_mix=None),
            _generate_poisson,
        ),
        Workload(
            "sharegpt_fixed_gap",
            "chunked-prefill paper: ShareGPT at a fixed gap (Aging: 100/200 at 0.1 s; LPRS: 1000 "
            "at 0.1 s or 1.0 s)",
            FixedGapParams(num_requests=200, gap_s=0.1),
            _generate_fixed_gap,
        ),
        Workload(
            "apc_mix",
            "chunked-prefill paper: APC ablation, 49:1 short (30-50 tokens) to long (200-220) "
            "prompts, rate changing low -> high -> low",
            ApcMixParams(
                num_requests=1000,
                short_tokens=(30, 50),
                long_tokens=(200, 220),
                short_per_long=49,
                phases=((0.25, 10.0), (0.5, 40.0), (0.25, 10.0)),
                output_tokens=(32, 128),
            ),
            _generate_apc_mix,
        ),
        Workload(
            "multi_turn",
            "multi-turn ShareGPT conversations, each turn resending its history (prefix "
            "caching)",
            MultiTurnParams(num_requests=300, conversation_rate_per_s=2.0, turn_gap_s=3.0,
                            max_turns=8, max_history_tokens=1536),
            _generate_multi_turn,
        ),
    )
}


def workload_params(
    name: str, num_requests: int | None = None, overrides: Mapping[str, Any] | None = None
) -> Params:
    """The named workload's parameters with ``overrides`` (field name -> value) applied."""
    workload = _workload(name)
    changes = dict(overrides or {})
    if num_requests is not None:
        changes["num_requests"] = num_requests
    valid = {f.name for f in fields(workload.defaults)}
    unknown = sorted(set(changes) - valid)
    if unknown:
        raise ValueError(
            f"{name} has no parameter(s) {', '.join(unknown)}; it has {', '.join(sorted(valid))}"
        )
    return replace(workload.defaults, **changes)


def build_workload(
    name: str,
    pool: PairPool,
    *,
    seed: int,
    num_requests: int | None = None,
    rate_scale: float = 1.0,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> list[WorkloadRequest]:
    """Generate the named workload's case from ``pool``; see the module docstring."""
    _positive("rate_scale", rate_scale)
    params = workload_params(name, num_requests, overrides)
    eligible = [
        pair
        for pair in pool.pairs
        if (max_prompt_tokens is None or pair.prompt_tokens <= max_prompt_tokens)
        and (max_output_tokens is None or pair.output_tokens <= max_output_tokens)
    ]
    rng = np.random.default_rng(seed)
    try:
        arrivals, pairs = _workload(name).generate(
            params, PairPool(eligible, pool.stats, pool.tokenizer, pool.sharegpt), rng
        )
    except ValueError as exc:
        raise ValueError(f"workload {name}: {exc}") from None
    order = np.argsort(arrivals, kind="stable")
    return [
        WorkloadRequest(
            id=f"{name}-s{seed}-{index:05d}",
            arrival_s=float(arrivals[i]) / rate_scale,
            prompt=pairs[i].prompt,
            prompt_tokens=pairs[i].prompt_tokens,
            output_tokens=pairs[i].output_tokens,
            tier=pairs[i].tier,
            request_class=pairs[i].request_class,
            category=name,
        )
        for index, i in enumerate(order)
    ]


def _workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None


def describe(workload: Workload) -> str:
    """``name: summary`` and one ``key = value`` line per default parameter."""
    lines = [f"{workload.name}: {workload.summary}"]
    for f in fields(workload.defaults):
        value = getattr(workload.defaults, f.name)
        lines.append(f"    {f.name} = {dict(value) if isinstance(value, Mapping) else value}")
    return "\n".join(lines)
