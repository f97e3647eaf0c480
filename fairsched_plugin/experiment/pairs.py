"""The pool of ShareGPT request/response pairs that workload cases are drawn from.

The ordering-policies paper (section 5.1) builds its workloads from human-to-assistant pairs:
tokenize prompt and response, drop pairs with fewer than four tokens on either side or above a
4096-token cap, de-duplicate, and label each pair by prompt length. This module does
exactly that, with the tokenizer of the model being served, so that the token counts
a case promises are the counts the engine sees.

Token counts are the engine's: a prompt is counted with the special tokens the
completions endpoint adds (the tiny model's BOS), a response without them (it stands
for generated tokens). Building is explicit and nothing is cached behind the caller's
back; ``write_pool``/``read_pool`` let a runner keep a pool as JSON Lines and reuse it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
from tokenizers import Tokenizer

from fairsched_plugin.sharegpt import SharegptReadStats, iter_conversations
from fairsched_plugin.user_files import read_text
from fairsched_plugin.policies.output_estimate import CLASSES as REQUEST_CLASSES
from fairsched_plugin.policies.output_estimate import prompt_class as request_class

MIN_TOKENS = 4
DEFAULT_MAX_TOKENS = 4096
DROP_REASONS = (
    "duplicate_prompt",
    "prompt_too_short",
    "prompt_too_long",
    "output_too_short",
    "output_too_long",
)
POOL_FORMAT = 1
POOL_KIND = "fairsched-pair-pool"
_ENCODE_BATCH = 4096
"""Pairs tokenized per call: large enough to keep every core busy, small enough that
``max_pairs`` stops the read soon after it is reached."""


class RawPair(NamedTuple):
    """A human turn and the gpt turn after it, before tokenizing."""

    conversation: int
    turn: int
    prompt: str
    response: str




@dataclass(frozen=True)
class Pair:
    """One human turn and the assistant turn right after it.

    ``conversation`` and ``turn`` locate the human turn in the source file (record
    index among complete records, turn index inside it), so a case can be traced back.
    """

    prompt: str
    prompt_tokens: int
    output_tokens: int
    tier: int
    conversation: int
    turn: int

    @property
    def request_class(self) -> str:
        return request_class(self.prompt_tokens)


@dataclass
class PoolStats:
    """What building a pool read and why pairs were dropped.

    Without ``stopped_early``, ``pairs_seen == kept + sum(dropped.values())``.
    ``stopped_early`` means ``max_pairs`` was reached: ``truncated`` then only covers
    the part of the file that was read, and pairs tokenized past the limit are
    counted as seen but neither kept nor dropped.
    """

    conversations: int = 0
    skipped_records: int = 0
    truncated: bool = False
    stopped_early: bool = False
    pairs_seen: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))

    def summary(self) -> str:
        """Human-readable lines for the CLI."""
        cut = "truncated file" if self.truncated else "whole file"
        if self.stopped_early:
            cut = "stopped at max_pairs"
        dropped = ", ".join(f"{reason} {n}" for reason, n in self.dropped.items())
        return (
            f"ShareGPT: {self.conversations} conversations read ({cut}), "
            f"{self.skipped_records} malformed records skipped\n"
            f"pairs: {self.pairs_seen} seen, {self.kept} kept; dropped: {dropped}"
        )


@dataclass
class PairPool:
    """The kept pairs, how they were obtained, and the tokenizer that counted them."""

    pairs: list[Pair]
    stats: PoolStats
    tokenizer: str
    """Path of the model directory or tokenizer.json; workloads that re-tokenize
    (cutting prompts to an exact length) load it from here."""
    sharegpt: str | None = None
    """The ShareGPT file the pairs were read from (None: the packaged one); workloads
    that need whole conversations (``multi_turn``) read them from here."""

    def class_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(REQUEST_CLASSES, 0)
        for pair in self.pairs:
            counts[pair.request_class] += 1
        return counts


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The served model's tokenizer, from its model directory or its tokenizer.json."""
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {file}")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises a bare Exception for any bad file
        raise ValueError(f"{file}: not a tokenizer.json ({exc})") from None


def cut_to_tokens(tokenizer: Tokenizer, text: str, n: int, search: int = 4) -> str | None:
    """A prefix of ``text`` that encodes to exactly ``n`` tokens (special tokens
    included), or None. Cutting at token ``n``'s end offset is usually exact; at a
    merge or a split multi-byte character it is not, so nearby cut points are tried."""
    encoding = tokenizer.encode(text)
    if len(encoding.ids) < n:
        return None
    for delta in sorted(range(-search, search + 1), key=abs):
        k = n + delta
        if 1 <= k <= len(encoding.ids):
            prefix = text[: encoding.offsets[k - 1][1]]
            if len(tokenizer.encode(prefix).ids) == n:
                return prefix
    return None


def iter_raw_pairs(
    conversations: Iterable[list[dict[str, str]]],
) -> Iterator[RawPair]:
    """(conversation, turn, prompt, response) for each human turn followed by a gpt turn."""
    for conv_index, turns in enumerate(conversations):
        for turn_index in range(len(turns) - 1):
            human, gpt = turns[turn_index], turns[turn_index + 1]
            if human.get("from") == "human" and gpt.get("from") == "gpt":
                yield RawPair(conv_index, turn_index, human["value"], gpt["value"])


def build_pool(
    tokenizer_path: str | Path,
    sharegpt_path: Path | None = None,
    *,
    max_prompt_tokens: int = DEFAULT_MAX_TOKENS,
    max_output_tokens: int = DEFAULT_MAX_TOKENS,
    max_pairs: int | None = None,
    tier_weights: Sequence[float] | None = None,
    tier_seed: int = 0,
) -> PairPool:
    """Read ShareGPT (the packaged file by default), tokenize and filter its pairs.

    Duplicates are dropped before tokenizing, by exact prompt text: the first
    occurrence is the one tokenized and kept or filtered. Pairs are tokenized in
    batches and the read stops as soon as ``max_pairs`` pairs are kept. With
    ``tier_weights`` each kept pair gets a seeded tier ``i`` with probability
    ``weights[i]`` (lower tier = more urgent, the OpenAI ``priority`` field);
    otherwise every tier is 0.
    """
    if max_pairs is not None and max_pairs <= 0:
        raise ValueError("max_pairs must be positive")
    tokenizer = load_tokenizer(tokenizer_path)
    read_stats = SharegptReadStats()
    stats = PoolStats()
    raw_pairs = iter_raw_pairs(iter_conversations(sharegpt_path, stats=read_stats))
    pairs: list[Pair] = []
    for batch in _unique_batches(raw_pairs, stats):
        pairs += _tokenize_and_filter(
            tokenizer, batch, max_prompt_tokens, max_output_tokens, stats
        )
        if max_pairs is not None and len(pairs) >= max_pairs:
            stats.stopped_early = True
            del pairs[max_pairs:]
            break
    stats.conversations = read_stats.conversations
    stats.skipped_records = read_stats.skipped
    stats.truncated = read_stats.truncated
    stats.kept = len(pairs)
    if tier_weights is not None:
        pairs = assign_tiers(pairs, tier_weights, tier_seed)
    # Absolute, so a saved pool still finds its tokenizer from another directory.
    return PairPool(pairs, stats, str(Path(tokenizer_path).resolve()),
                    str(Path(sharegpt_path).resolve()) if sharegpt_path else None)


def _unique_batches(
    raw_pairs: Iterable[RawPair], stats: PoolStats
) -> Iterator[list[RawPair]]:
    """Batches of pairs whose prompt text was not seen before; counts what it reads."""
    seen: set[str] = set()
    batch: list[RawPair] = []
    for raw in raw_pairs:
        stats.pairs_seen += 1
        if raw.prompt in seen:
            stats.dropped["duplicate_prompt"] += 1
            continue
        seen.add(raw.prompt)
        batch.append(raw)
        if len(batch) == _ENCODE_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _encode_lengths(tokenizer: Tokenizer, texts: list[str], special: bool) -> list[int]:
    # encode_batch_fast (tokenizers >= 0.21) skips offset tracking, about 30% faster.
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    return [len(e.ids) for e in encode(texts, add_special_tokens=special)]


def _tokenize_and_filter(
    tokenizer: Tokenizer,
    batch: list[RawPair],
    max_prompt_tokens: int,
    max_output_tokens: int,
    stats: PoolStats,
) -> list[Pair]:
    """Keep the batch's pairs whose lengths pass; responses are only tokenized for
    pairs whose prompt passed, since responses are most of the text."""
    prompt_lengths = _encode_lengths(tokenizer, [raw.prompt for raw in batch], special=True)
    survivors = []
    for raw, n in zip(batch, prompt_lengths):
        if n < MIN_TOKENS:
            stats.dropped["prompt_too_short"] += 1
        elif n > max_prompt_tokens:
            stats.dropped["prompt_too_long"] += 1
        else:
            survivors.append((raw, n))
    responses = [raw.response for raw, _ in survivors]
    output_lengths = _encode_lengths(tokenizer, responses, special=False)
    kept = []
    for (raw, n_prompt), n_output in zip(survivors, output_lengths):
        if n_output < MIN_TOKENS:
            stats.dropped["output_too_short"] += 1
        elif n_output > max_output_tokens:
            stats.dropped["output_too_long"] += 1
        else:
            kept.append(Pair(raw.prompt, n_prompt, n_output, 0, raw.conversation, raw.turn))
    return kept


def assign_tiers(pairs: Sequence[Pair], weights: Sequence[float], seed: int) -> list[Pair]:
    """Copies of ``pairs`` with seeded service tiers drawn with the given weights."""
    probabilities = np.asarray(weights, dtype=float)
    if probabilities.ndim != 1 or len(probabilities) == 0 or (probabilities < 0).any():
        raise ValueError("tier weights must be a non-empty list of non-negative numbers")
    if probabilities.sum() <= 0:
        raise ValueError("tier weights must not all be zero")
    rng = np.random.default_rng(seed)
    tiers = rng.choice(len(probabilities), size=len(pairs), p=probabilities / probabilities.sum())
    return [replace(pair, tier=int(tier)) for pair, tier in zip(pairs, tiers)]


def write_pool(path: Path, pool: PairPool) -> None:
    """One header line (format, tokenizer, build stats), then one line per pair."""
    header = {
        "kind": POOL_KIND,
        "format": POOL_FORMAT,
        "tokenizer": pool.tokenizer,
        "sharegpt": pool.sharegpt,
        "stats": asdict(pool.stats),
    }
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        for pair in pool.pairs:
            f.write(json.dumps(asdict(pair), ensure_ascii=False) + "\n")


def read_pool(path: Path) -> PairPool:
    """Read what ``write_pool`` wrote; a file of another kind or format is refused, and a
    line that is not a pair is named (``ValueError``)."""
    lines = io.StringIO(read_text(path), newline=None)
    try:
        header = json.loads(lines.readline() or "null")
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("kind") != POOL_KIND:
        raise ValueError(f"{path}: not a pair pool (no {POOL_KIND!r} header line)")
    if header.get("format") != POOL_FORMAT:
        raise ValueError(f"{path}: pool format {header.get('format')}, expected {POOL_FORMAT}")
    try:
        stats, tokenizer = PoolStats(**header["stats"]), str(header["tokenizer"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}:1: not a pool header ({type(exc).__name__}: {exc})") from None
    pairs = [_pool_pair(path, number, line)
             for number, line in enumerate(lines, start=2) if line.strip()]
    return PairPool(pairs, stats, tokenizer, header.get("sharegpt"))


def _pool_pair(path: Path, number: int, line: str) -> Pair:
    """Line ``number`` of a pool, or a ``ValueError`` naming it."""
    try:
        return Pair(**json.loads(line))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
    except TypeError as exc:  # not an object, or other keys than a pair's
        raise ValueError(f"{path}:{number}: not a pair ({exc})") from None
