"""From profiled steps to training data (the chunked-prefill paper, section 3.2.1 item 3): clean,
bucket by scheduled tokens, downsample over-represented full-chunk steps, split 8:1:1, weight by
bucket.

Why each step:

- *Cleaning* drops rows that are not measurements of work (non-finite values, latency
  <= 0, nothing scheduled) and, per bucket, latencies above Q3 + ``outlier_iqr`` x IQR:
  pauses that are not the batch's cost (a compile, a page fault storm, the machine busy
  with something else).
- *Buckets* of ``bucket_width`` scheduled tokens group steps of similar size.
- *Downsampling*: under load most steps fill the token budget (a prefill chunk is cut to
  what the budget leaves), so these full-chunk steps dwarf every other size and a model
  trained on them learns little else. They are sampled down to ``max_bucket_ratio`` times
  the largest bucket of other steps. The budget is ``token_budget``, else the largest
  scheduled-token count seen. Other imbalance (a lightly loaded engine's many small
  decode steps) is left to the weights: dropping it would throw away most of such a
  profile.
- *Split* 8:1:1 within each bucket (seeded), so validation and test see every size.
- *Weights* ``count_b ** -weight_power`` per bucket, scaled to mean 1 on the training set,
  so rare batch sizes count for more without letting a single-sample bucket dominate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .features import RAW_FEATURES, feature_matrix

_PREFILL = RAW_FEATURES.index("prefill_tokens")
_DECODE = RAW_FEATURES.index("decode_tokens")


@dataclass(frozen=True)
class DatasetConfig:
    bucket_width: int = 32
    max_bucket_ratio: float = 3.0
    token_budget: int | None = None
    outlier_iqr: float = 3.0
    weight_power: float = 0.5
    split: tuple[float, float, float] = (0.8, 0.1, 0.1)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.bucket_width < 1:
            raise ValueError(f"bucket_width must be >= 1, got {self.bucket_width}")
        if not self.max_bucket_ratio >= 1:
            raise ValueError(f"max_bucket_ratio must be >= 1, got {self.max_bucket_ratio}")
        if self.token_budget is not None and self.token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {self.token_budget}")
        if not self.outlier_iqr >= 0:
            raise ValueError(f"outlier_iqr must be >= 0 (0: keep outliers), got "
                             f"{self.outlier_iqr}")
        if not self.weight_power >= 0:
            raise ValueError(f"weight_power must be >= 0, got {self.weight_power}")
        if len(self.split) != 3 or min(self.split) < 0 or self.split[0] <= 0:
            raise ValueError(f"split must be three shares (train > 0), got {self.split}")


@dataclass
class Split:
    """One part of the data: 16-feature rows, latencies (ms), buckets, weights."""

    features: np.ndarray
    latency_ms: np.ndarray
    bucket: np.ndarray
    weight: np.ndarray

    def __len__(self) -> int:
        return len(self.latency_ms)


@dataclass
class PreparedData:
    train: Split
    val: Split
    test: Split
    counts: dict[str, int] = field(default_factory=dict)
    """Rows read, dropped for each reason, downsampled, and in each split."""


def scheduled_tokens(raw: np.ndarray) -> np.ndarray:
    return raw[:, _PREFILL] + raw[:, _DECODE]


def clean(
    raw: np.ndarray, latency_ms: np.ndarray, config: DatasetConfig
) -> tuple[np.ndarray, dict[str, int]]:
    """Indices of the rows worth learning from, and how many each rule dropped."""
    finite = np.isfinite(raw).all(axis=1) & np.isfinite(latency_ms)
    valid = finite & (latency_ms > 0) & (raw >= 0).all(axis=1) & (scheduled_tokens(raw) > 0)
    keep = valid.copy()
    if config.outlier_iqr > 0 and valid.any():
        buckets = bucket_of(raw, config.bucket_width)
        for b in np.unique(buckets[valid]):
            members = np.flatnonzero(valid & (buckets == b))
            q1, q3 = np.percentile(latency_ms[members], [25, 75])
            limit = q3 + config.outlier_iqr * (q3 - q1)
            keep[members[latency_ms[members] > limit]] = False
    counts = {
        "dropped_invalid": int((~valid).sum()),
        "dropped_outliers": int((valid & ~keep).sum()),
    }
    return np.flatnonzero(keep), counts


def bucket_of(raw: np.ndarray, bucket_width: int) -> np.ndarray:
    """Bucket index: scheduled tokens 1..width -> 0, width+1..2*width -> 1, ..."""
    return ((scheduled_tokens(raw) - 1) // bucket_width).astype(np.int64)


def downsample_full_chunks(
    scheduled: np.ndarray, buckets: np.ndarray, budget: float, max_ratio: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Positions to keep: all steps below ``budget`` scheduled tokens, and of the steps at
    the budget at most ``max_ratio`` x the largest bucket of the others."""
    full = scheduled >= budget
    others = buckets[~full]
    if not full.any() or others.size == 0:
        return np.arange(len(scheduled))
    cap = int(np.ceil(max_ratio * np.bincount(others).max()))
    full_positions = np.flatnonzero(full)
    if len(full_positions) > cap:
        full_positions = rng.choice(full_positions, size=cap, replace=False)
    return np.sort(np.concatenate([np.flatnonzero(~full), full_positions]))


def split_by_bucket(
    buckets: np.ndarray, shares: tuple[float, float, float], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions of train, validation and test: each bucket shuffled and cut by ``shares``
    (validation and test rounded down, so a bucket of one or two rows trains)."""
    total = sum(shares)
    parts: tuple[list[np.ndarray], ...] = ([], [], [])
    for label in np.unique(buckets):
        members = rng.permutation(np.flatnonzero(buckets == label))
        n_val = int(len(members) * shares[1] / total)
        n_test = int(len(members) * shares[2] / total)
        parts[1].append(members[:n_val])
        parts[2].append(members[n_val : n_val + n_test])
        parts[0].append(members[n_val + n_test :])
    train, val, test = (np.sort(np.concatenate(p)) for p in parts)
    return train, val, test


def bucket_weights(buckets: np.ndarray, train_buckets: np.ndarray, power: float) -> np.ndarray:
    """``count_b ** -power`` per row, counts from the training split, mean 1 on it."""
    labels, counts = np.unique(train_buckets, return_counts=True)
    per_bucket = dict(zip(labels.tolist(), counts.astype(np.float64) ** -power))
    train_mean = np.mean([per_bucket[b] for b in train_buckets.tolist()])
    # A bucket absent from training (possible only for tiny buckets) gets the rarest weight.
    rarest = max(per_bucket.values())
    return np.array([per_bucket.get(b, rarest) for b in buckets.tolist()]) / train_mean


def prepare(raw: np.ndarray, latency_ms: np.ndarray, config: DatasetConfig) -> PreparedData:
    """Clean, bucket, downsample, split and weight; raises ``ValueError`` if too little
    is left to train, validate and test on."""
    rng = np.random.default_rng(config.seed)
    kept, counts = clean(raw, latency_ms, config)
    counts = {"read": len(latency_ms), **counts}
    scheduled = scheduled_tokens(raw[kept])
    budget = config.token_budget or (scheduled.max() if len(kept) else 0)
    sampled = kept[downsample_full_chunks(
        scheduled, bucket_of(raw[kept], config.bucket_width), budget,
        config.max_bucket_ratio, rng,
    )]
    counts["downsampled"] = len(kept) - len(sampled)
    buckets = bucket_of(raw[sampled], config.bucket_width)
    parts = split_by_bucket(buckets, config.split, rng)
    if min(len(p) for p in parts) == 0:
        raise ValueError(
            f"too few usable samples: {len(sampled)} of {len(latency_ms)} left after cleaning "
            f"and downsampling ({counts}); profile more steps"
        )
    features = feature_matrix(raw[sampled])
    weights = bucket_weights(buckets, buckets[parts[0]], config.weight_power)
    splits = [
        Split(features[p], latency_ms[sampled][p].astype(np.float32), buckets[p], weights[p])
        for p in parts
    ]
    counts.update(train=len(splits[0]), val=len(splits[1]), test=len(splits[2]))
    return PreparedData(*splits, counts=counts)
