"""The 16 features against hand-computed values (the chunked-prefill paper's Tables 1 and 2)."""

from __future__ import annotations

import numpy as np
import pytest

from fairsched_plugin.predictor.features import (
    DERIVED_FEATURES,
    FEATURE_NAMES,
    FEATURE_UNITS,
    RAW_FEATURES,
    BatchStats,
    MemoryState,
    StepRows,
    batch_row,
    feature_matrix,
    raw_vector,
)

MEMORY = MemoryState(used_mb=1000.0, free_mb=3000.0, allocated_mb=800.0, reserved_mb=900.0)


def _batch() -> BatchStats:
    """Two decodes (contexts 100 and 300) and two prefill chunks (64 tokens with 0 computed
    before, 32 with 128 computed before)."""
    stats = BatchStats()
    stats.add_decode(100)
    stats.add_decode(300)
    stats.add_prefill(64, processed=0)
    stats.add_prefill(32, processed=128)
    return stats


def test_names_follow_the_tables_in_order():
    assert RAW_FEATURES == (
        "prefill_tokens", "decode_tokens", "batch_request_count", "sum_decode_context_len",
        "max_decode_context_len", "prefill_processed_tokens", "max_prefill_processed_tokens",
        "gpu_mem_used_mb", "gpu_mem_free_mb", "cuda_allocated_mb", "cuda_reserved_mb",
    )
    assert DERIVED_FEATURES == (
        "bias", "scheduled_tokens", "avg_decode_ctx", "decode_ctx_interaction",
        "prefill_interaction",
    )
    assert FEATURE_NAMES == RAW_FEATURES + DERIVED_FEATURES
    assert set(FEATURE_UNITS) == set(FEATURE_NAMES)


def test_batch_stats_accumulate_requests():
    stats = _batch()
    assert (stats.prefill_tokens, stats.decode_tokens, stats.batch_request_count) == (96, 2, 4)
    assert (stats.sum_decode_context_len, stats.max_decode_context_len) == (400, 300)
    assert (stats.prefill_processed_tokens, stats.max_prefill_processed_tokens) == (128, 128)


def test_raw_vector_is_table_1_in_order():
    raw = raw_vector(_batch(), MEMORY)
    assert raw.dtype == np.float32
    assert raw.tolist() == [96, 2, 4, 400, 300, 128, 128, 1000, 3000, 800, 900]


def test_derived_features_are_table_2():
    rows = feature_matrix(raw_vector(_batch(), MEMORY)[None, :])
    assert rows.shape == (1, 16) and rows.dtype == np.float32
    derived = dict(zip(DERIVED_FEATURES, rows[0, 11:].tolist()))
    assert derived == {
        "bias": 1.0,
        "scheduled_tokens": 98.0,             # 2 decode + 96 prefill tokens
        "avg_decode_ctx": 200.0,              # 400 / max(2, 1)
        "decode_ctx_interaction": 400.0,      # 2 * 200
        "prefill_interaction": 96.0 * 128.0,  # prefill tokens * processed tokens
    }


def test_avg_decode_ctx_divides_by_decode_tokens_and_never_by_zero():
    prefill_only = BatchStats()
    prefill_only.add_prefill(50, processed=10)
    speculative = BatchStats()
    speculative.add_decode(90, tokens=3)  # one decode with two speculative tokens
    rows = feature_matrix(np.stack([raw_vector(prefill_only, MEMORY),
                                    raw_vector(speculative, MEMORY)]))
    avg = FEATURE_NAMES.index("avg_decode_ctx")
    interaction = FEATURE_NAMES.index("decode_ctx_interaction")
    assert rows[0, avg] == 0.0 and rows[0, interaction] == 0.0
    assert rows[1, avg] == 30.0 and rows[1, interaction] == 90.0  # Table 2 as written


def test_large_interactions_are_computed_exactly_enough():
    stats = BatchStats()
    stats.add_prefill(8192, processed=120_000)
    row = feature_matrix(raw_vector(stats, MEMORY)[None, :])[0]
    assert row[FEATURE_NAMES.index("prefill_interaction")] == pytest.approx(8192 * 120_000,
                                                                           rel=1e-7)


def test_feature_matrix_rejects_rows_that_are_not_11_raw_features():
    with pytest.raises(ValueError, match=r"11 raw features.*shape \(3, 16\)"):
        feature_matrix(np.zeros((3, 16)))


def _copy(stats: BatchStats) -> BatchStats:
    return BatchStats(**{name: getattr(stats, name) for name in BatchStats.__slots__})


def test_batch_row_is_the_feature_matrix_of_one_batch():
    assert batch_row(_batch(), MEMORY).tolist() == feature_matrix(
        raw_vector(_batch(), MEMORY)[None, :])[0].tolist()


def test_step_rows_grow_the_batch_by_each_candidate_and_the_chunks_before_it():
    stats = _batch()
    rows = StepRows(stats, MEMORY).rows(stats, [
        (500, 64, np.array([1, 32, 64])),   # joins with 64 tokens
        (7, 0, np.array([], dtype=np.int64)),  # held back: no rows, not in the batch
        (20, 0, np.array([1, 16])),         # scored, then not in the batch
        (5, 10, np.array([8])),             # sees the 64-token prefill, not the others
    ])
    expected = []
    for chunk in (1, 32, 64):
        grown = _batch()
        grown.add_prefill(chunk, processed=500)
        expected.append(raw_vector(grown, MEMORY))
    before = _batch()
    before.add_prefill(64, processed=500)
    for processed, chunk in ((20, 1), (20, 16), (5, 8)):
        grown = _copy(before)
        grown.add_prefill(chunk, processed)
        expected.append(raw_vector(grown, MEMORY))
    np.testing.assert_array_equal(rows, feature_matrix(np.stack(expected)))
    assert stats == _batch()  # the committed batch is not changed
    assert rows[-1, FEATURE_NAMES.index("max_prefill_processed_tokens")] == 500


def test_step_rows_equal_the_feature_matrix_on_random_batches():
    """Bit for bit, with token counts and memory of realistic size: LPRS's choices must not
    depend on how its rows were built."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        stats = BatchStats()
        for _ in range(rng.integers(0, 40)):
            stats.add_decode(int(rng.integers(0, 30_000)), int(rng.choice([1, 3])))
        memory = MemoryState(*rng.uniform(0, 80_000, 4))
        rows = StepRows(stats, memory)
        for _ in range(rng.integers(0, 4)):
            stats.add_prefill(int(rng.integers(1, 2048)), int(rng.integers(0, 100_000)))
        candidates, expected, grown = [], [], _copy(stats)
        for _ in range(rng.integers(1, 9)):
            processed = int(rng.integers(0, 200_000))
            chunks = np.unique(rng.integers(1, 2048, size=rng.integers(0, 6)))
            joins = int(rng.choice([0, rng.integers(1, 2048)]))
            candidates.append((processed, joins, chunks))
            for chunk in chunks.tolist():
                row = _copy(grown)
                row.add_prefill(chunk, processed)
                expected.append(raw_vector(row, memory))
            if joins:
                grown.add_prefill(joins, processed)
        if expected:
            np.testing.assert_array_equal(rows.rows(stats, candidates),
                                          feature_matrix(np.stack(expected)))
        assert batch_row(grown, memory).tolist() == feature_matrix(
            raw_vector(grown, memory)[None, :])[0].tolist()
