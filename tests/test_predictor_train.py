"""Data preparation, the loss, and a short training run that must beat a constant."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fairsched_plugin.predictor.dataset import (  # noqa: E402
    DatasetConfig,
    bucket_of,
    bucket_weights,
    clean,
    downsample_full_chunks,
    prepare,
    split_by_bucket,
)
from fairsched_plugin.predictor.evaluate import accuracy_metrics  # noqa: E402
from fairsched_plugin.predictor.train import (  # noqa: E402
    TrainConfig,
    asymmetric_huber,
    build_model,
    predict,
    train_model,
)
from predictor_data import NOISE_MS, synthetic_steps  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    """Two cores shared with other work: more torch threads only wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _raw(prefill: list[int], decode: list[int]) -> np.ndarray:
    raw = np.zeros((len(prefill), 11))
    raw[:, 0], raw[:, 1] = prefill, decode
    return raw


def test_buckets_count_scheduled_tokens():
    raw = _raw([0, 31, 32, 200], [1, 1, 1, 56])
    assert bucket_of(raw, 32).tolist() == [0, 0, 1, 7]


def test_clean_drops_invalid_rows_and_outliers_within_a_bucket():
    raw = _raw([10] * 12 + [0, 5, 5], [0] * 12 + [0, 0, 0])
    raw[14, 3] = np.nan
    latency = np.array([10.0, 10.5, 9.5, 10.2, 9.8, 10.1, 9.9, 10.0, 10.3, 9.7, 10.0, 80.0,
                        5.0, -1.0, 5.0])
    kept, counts = clean(raw, latency, DatasetConfig(outlier_iqr=3.0))
    # Row 11 is a pause (80 ms among 10 ms steps); 12 scheduled nothing, 13 has a negative
    # latency, 14 a missing feature.
    assert kept.tolist() == list(range(11))
    assert counts == {"dropped_invalid": 3, "dropped_outliers": 1}
    kept, counts = clean(raw, latency, DatasetConfig(outlier_iqr=0))
    assert 11 in kept and counts["dropped_outliers"] == 0


def test_full_chunk_steps_are_sampled_down_to_a_multiple_of_the_largest_other_bucket():
    # Budget 256: 200 steps fill it; the largest other bucket (1..32 tokens) has 12 steps.
    scheduled = np.array([5] * 12 + [40] * 10 + [250] * 8 + [256] * 200)
    buckets = (scheduled - 1) // 32
    kept = downsample_full_chunks(scheduled, buckets, 256, max_ratio=2.0,
                                  rng=np.random.default_rng(0))
    assert np.bincount(scheduled[kept] == 256).tolist() == [30, 2 * 12]
    assert len(set(kept.tolist())) == len(kept)


def test_no_full_chunk_steps_means_nothing_is_dropped():
    scheduled = np.array([1] * 500 + [64, 128])  # a lightly loaded engine: small decode steps
    kept = downsample_full_chunks(scheduled, (scheduled - 1) // 32, 256, max_ratio=3.0,
                                  rng=np.random.default_rng(0))
    assert kept.tolist() == list(range(502))


def test_split_is_8_1_1_per_bucket_disjoint_and_seeded():
    buckets = np.repeat([0, 1, 2], [100, 50, 2])
    train, val, test = split_by_bucket(buckets, (0.8, 0.1, 0.1), np.random.default_rng(3))
    assert sorted(np.concatenate([train, val, test]).tolist()) == list(range(152))
    assert np.bincount(buckets[val]).tolist() == [10, 5]
    assert np.bincount(buckets[test]).tolist() == [10, 5]
    assert np.bincount(buckets[train]).tolist() == [80, 40, 2]
    again = split_by_bucket(buckets, (0.8, 0.1, 0.1), np.random.default_rng(3))
    assert all(np.array_equal(a, b) for a, b in zip((train, val, test), again))


def test_bucket_weights_favour_rare_buckets_and_average_one_on_train():
    train = np.array([0] * 100 + [1] * 4)
    weights = bucket_weights(train, train, power=0.5)
    assert weights.mean() == pytest.approx(1.0)
    assert weights[-1] / weights[0] == pytest.approx(5.0)  # sqrt(100 / 4)


def test_asymmetric_huber_penalises_under_prediction_more():
    measured = torch.tensor([2.0, 0.0, 0.5])
    predicted = torch.tensor([0.0, 2.0, 0.0])
    weight = torch.tensor([1.0, 1.0, 2.0])
    # Huber (delta 1): |r| = 2 -> 1.5, |r| = 0.5 -> 0.125. Under-predictions x 3.
    loss = asymmetric_huber(predicted, measured, weight, delta=1.0, under_weight=3.0)
    assert loss.item() == pytest.approx((3 * 1.5 + 1.5 + 2 * 3 * 0.125) / 3)


def test_train_config_rejects_an_under_weight_that_does_not_penalise():
    with pytest.raises(ValueError, match="under_weight=1.0"):
        TrainConfig(under_weight=1.0)


def test_constant_features_do_not_divide_by_zero():
    data = prepare(*synthetic_steps(200), DatasetConfig())
    model = build_model(data.train, TrainConfig())
    assert model.feature_std[11].item() == 1.0  # bias
    assert np.isfinite(predict(model, data.test.features)).all()


def test_short_training_beats_a_constant_on_held_out_data():
    data = prepare(*synthetic_steps(600, seed=1), DatasetConfig(seed=1))
    result = train_model(data.train, data.val, TrainConfig(epochs=60, batch_size=64, seed=1))
    model_mae = accuracy_metrics(data.test.latency_ms, predict(result.model, data.test.features))
    constant = np.full(len(data.test), np.median(data.train.latency_ms))
    constant_mae = accuracy_metrics(data.test.latency_ms, constant)["mae_ms"]
    assert model_mae["mae_ms"] < 0.3 * constant_mae
    assert model_mae["mae_ms"] < 4 * NOISE_MS
    assert 1 <= result.best_epoch <= result.epochs_run <= 60
    assert len(result.history) == result.epochs_run


def test_training_is_reproducible_with_a_seed():
    data = prepare(*synthetic_steps(200), DatasetConfig())
    config = TrainConfig(epochs=3, batch_size=64)
    first = predict(train_model(data.train, data.val, config).model, data.test.features)
    second = predict(train_model(data.train, data.val, config).model, data.test.features)
    np.testing.assert_array_equal(first, second)


def test_early_stopping_keeps_the_best_epoch():
    data = prepare(*synthetic_steps(200), DatasetConfig())
    result = train_model(data.train, data.val, TrainConfig(epochs=200, patience=2, lr=0.5))
    assert result.epochs_run == result.best_epoch + 2 < 200
    best = min(h["val_loss"] for h in result.history)
    assert result.history[result.best_epoch - 1]["val_loss"] == best
