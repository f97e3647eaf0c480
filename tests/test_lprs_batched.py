"""LPRS scores a step's candidates in few batched predictor calls (speculation), and
chooses exactly the chunks Algorithm 1 chooses one candidate at a time.

The reference below is the sequential procedure written the obvious way: for each
candidate in the plan's order, the rows of the batch built so far plus each candidate
chunk (``feature_matrix`` of the grown batches), one predictor call, the paper's loop,
then alignment and APC. Both rules run through the same plan on many random steps with
real ONNX Runtime sessions: the hand-made linear model and the trained CPU-engine MLP.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from fairsched_plugin.policies.chunk_rule import LatencyChunkRule  # noqa: E402
from fairsched_plugin.config import APCConfig, LPRSConfig  # noqa: E402
from fairsched_plugin.policies import AgingPolicy, FCFSPolicy, RequestView, plan_prefill_caps  # noqa: E402
from fairsched_plugin.policies.alignment import align_chunk  # noqa: E402
from fairsched_plugin.policies.apc import ActivePrefillControl  # noqa: E402
from fairsched_plugin.policies.lprs import candidate_chunks  # noqa: E402
from fairsched_plugin.predictor.features import (  # noqa: E402
    BatchStats,
    batch_row,
    feature_matrix,
    raw_vector,
)
from fairsched_plugin.predictor.memory import KvCacheMemory  # noqa: E402
from fairsched_plugin.predictor.runtime import LatencyPredictor  # noqa: E402
from fairsched_plugin.predictor.roofline import RooflineLatencyModel, roofline_ms  # noqa: E402
from fairsched_plugin.predictor.hardware import accelerator, model_config  # noqa: E402
from linear_onnx import write_linear_model  # noqa: E402

CPU_MODEL = (Path(__file__).resolve().parent.parent / "benchmarks" / "results"
             / "2026-11-30-predictor-cpu" / "model.onnx")
BLOCK = 16


def _first_end(computed, least, remaining, bound, otherwise):
    """The smallest chunk of at least ``least`` tokens, at most ``bound``, that ends on a
    block or the prompt; else the largest that ends on a block; else ``otherwise``."""
    ends = [c for c in range(1, min(bound, remaining) + 1)
            if (computed + c) % BLOCK == 0 or c == remaining]
    above = [c for c in ends if c >= least]
    return above[0] if above else (ends[-1] if ends else otherwise)


class SequentialReference:
    """Algorithm 1 with one predictor call per candidate, then alignment and APC: the
    procedure the batched rule must reproduce exactly."""

    def __init__(self, lprs: LPRSConfig, apc: APCConfig, predictor, memory, align: bool):
        self.lprs, self.predictor, self.memory, self.align = lprs, predictor, memory, align
        self.apc = (ActivePrefillControl(apc.max_active_prefills, apc.min_chunk,
                                         apc.max_deferred_steps) if apc.enabled else None)
        if self.apc is not None:  # its warm-start and forced chunks, aligned as below
            decide = self.apc._decide

            def aligned_decide(request_id, proposed, bound, remaining, active, started,
                               computed):
                chunk, outcome = decide(request_id, proposed, bound, remaining, active,
                                        started, 0)
                if align and outcome.value in ("warm_start", "forced"):
                    chunk = _first_end(computed, chunk, remaining, bound, chunk)
                return chunk, outcome

            self.apc._decide = aligned_decide
        self.bias_ms = 0.0
        self.fallbacks = 0
        self.calls = 0

    def begin_step(self, decodes, max_seqs, token_budget):
        self.batch = BatchStats()
        for context_len, tokens in decodes:
            self.batch.add_decode(context_len, tokens)
        self.committed = self.batch.decode_tokens
        self.memory_state = self.memory.read()
        self.fell_back = False
        self.scored = 0
        if self.apc is not None:
            self.apc.begin_step(max_seqs, len(decodes), token_budget, self.committed)

    def choose(self, view, bound, walk):
        remaining = view.remaining_prefill
        if self.apc is not None and self.apc.holds_back(view.request_id, bound >= remaining):
            proposed = bound
        else:
            proposed = self._algorithm_1(view, bound)
        if self.align:
            aligned = align_chunk(view.computed_tokens, proposed, remaining, BLOCK)
            if aligned == 0 and self.committed == 0 and proposed > 0:  # an empty batch
                aligned = _first_end(view.computed_tokens, 1, remaining, bound, proposed)
            proposed = aligned
        chunk = proposed
        if self.apc is not None:
            chunk = self.apc.choose(view.request_id, proposed, bound, remaining,
                                    view.computed_tokens)
        if chunk > 0:
            self.batch.add_prefill(chunk, view.computed_tokens)
            self.committed += chunk
        return chunk

    def _algorithm_1(self, view, bound):
        if not self.lprs.enabled or self.fell_back or bound < 1:
            return bound
        chunks = candidate_chunks(bound, self.lprs.granularity).tolist()
        grown = []
        for chunk in chunks:
            batch = BatchStats(**{f: getattr(self.batch, f) for f in self.batch.__slots__})
            batch.add_prefill(chunk, view.computed_tokens)
            grown.append(raw_vector(batch, self.memory_state))
        self.calls += 1
        try:
            predicted = self.predictor.predict(feature_matrix(np.stack(grown))) + self.bias_ms
        except Exception:
            predicted = None
        predicted = None if predicted is None else np.asarray(predicted, np.float64).tolist()
        if predicted is None or not all(0 <= t < math.inf for t in predicted):
            self.fell_back = True
            self.fallbacks += 1
            return bound
        self.scored += len(chunks)
        best, best_score = 0, math.inf
        for chunk, t in zip(chunks, predicted):
            if t <= self.lprs.target_ms:
                s = self.lprs.underfill_penalty * (self.lprs.target_ms - t)
            else:
                s = self.lprs.overflow_penalty * (t - self.lprs.target_ms)
            if s < best_score or (s == best_score and chunk > best):
                best, best_score = chunk, s
        return best


class Recording:
    """Records the (request, bound, chunk) decisions of the rule it wraps."""

    def __init__(self, rule):
        self.rule, self.decisions = rule, []

    def choose(self, view, bound, walk):
        chunk = self.rule.choose(view, bound, walk)
        self.decisions.append((view.request_id, bound, chunk))
        return chunk


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    directory = tmp_path_factory.mktemp("models")
    return {
        "linear": LatencyPredictor.load(write_linear_model(directory / "linear.onnx", 4.0, 0.15)),
        "steep": LatencyPredictor.load(write_linear_model(directory / "steep.onnx", 2.0, 0.9)),
        # Negative for large batches: the nonsense fallback at some candidates, not others.
        "negative": LatencyPredictor.load(write_linear_model(directory / "neg.onnx", 60.0, -0.2)),
        "cpu-mlp": LatencyPredictor.load(CPU_MODEL),
        # The built-in model: monotone, so LPRS skips its search in steps it cannot bind.
        "built-in": RooflineLatencyModel(model_config("qwen3-8b"), accelerator("h100"), "test"),
    }


def _random_step(rng: random.Random, case: int):
    policy = rng.choice([FCFSPolicy(), AgingPolicy(alpha=37.5, beta=-1.0)])
    views = []
    for i in range(rng.randint(0, 12) + rng.randint(0, 12)):
        prompt = rng.choice([rng.randint(1, 40), rng.randint(20, 300), rng.randint(200, 4000)])
        views.append(RequestView(f"c{case}-{i}", rng.randint(0, 40) / 4, prompt,
                                 computed_tokens=rng.randint(0, prompt - 1)))
    n_running = rng.randint(0, len(views))
    running, waiting = views[:n_running], views[n_running:]
    for view in waiting:
        view.computed_tokens = 0
    waiting.sort(key=policy.key)
    decodes = [(rng.randint(1, 3000), rng.choice([1, 1, 1, 3]))
               for _ in range(rng.choice([0, 0, rng.randint(1, 40)]))]
    return policy, running, waiting, decodes


def _configs(rng: random.Random):
    lprs = LPRSConfig(enabled=True, target_ms=rng.choice([5.0, 12.0, 30.0, 60.0, 200.0]),
                      granularity=rng.choice([1, 8, 32, 64]),
                      underfill_penalty=1.0, overflow_penalty=rng.choice([1.5, 4.0]))
    apc = APCConfig(enabled=rng.random() < 0.7, max_active_prefills=rng.randint(1, 10),
                    min_chunk=rng.choice([1, 16, 48]), max_deferred_steps=rng.randint(1, 4))
    return lprs, apc, rng.random() < 0.3


def _run(rule, policy, running, waiting, decodes, budget, slots, kv, full):
    rule.begin_step(decodes, 256, budget)
    recording = Recording(rule)
    caps = plan_prefill_caps(policy, running, iter(waiting), sum(n for _, n in decodes), budget,
                             slots, kv, full, rule=recording)
    return caps, recording.decisions


@pytest.mark.parametrize("model", ["linear", "steep", "negative", "cpu-mlp", "built-in"])
def test_batched_lprs_chooses_exactly_what_the_sequential_algorithm_chooses(models, model):
    predictor = models[model]
    rng = random.Random(f"lprs-{model}")
    calls = sequential_calls = 0
    skipped = cut = 0
    for case in range(150):
        lprs, apc, align = _configs(rng)
        used = rng.uniform(0, 2000)
        memory = KvCacheMemory(lambda used=used: (int(used), int(2048 - used), 2**20))
        batched = LatencyChunkRule(lprs, apc, predictor, memory, BLOCK, align)
        reference = SequentialReference(lprs, apc, predictor, memory, align)
        policy, running, waiting, decodes = _random_step(rng, case)
        budget = rng.choice([16, 64, 256, 512, 2048])
        slots, kv, full = rng.randint(0, 12), rng.choice([50, 2000, 10**9]), rng.random() < 0.5
        for step in range(3):  # APC's deferral streaks and the bias carry across steps
            bias = rng.choice([0.0, 0.0, rng.uniform(-10, 10)])
            batched.bias_ms = reference.bias_ms = bias
            got = _run(batched, policy, running, waiting, decodes, budget, slots, kv, full)
            expected = _run(reference, policy, running, waiting, decodes, budget, slots, kv, full)
            context = (model, case, step)
            assert got == expected, context
            assert batched.fallbacks == reference.fallbacks, context
            record = batched.step_record()
            skipped += record["lprs_candidates"] < reference.scored
            cut += record["lprs_cut"]
            if model != "built-in":  # the built-in model skips the search it can
                assert record["lprs_candidates"] == reference.scored, context
            if batched.apc is not None:
                assert batched.apc.counts == reference.apc.counts, context
                assert batched.apc.deferred == reference.apc.deferred, context
            calls += record["lprs_calls"]
            sequential_calls += reference.calls
            reference.calls = 0
            caps = got[0]
            for view in running:
                view.computed_tokens = min(view.computed_tokens + caps.get(view.request_id, 0),
                                           view.prompt_tokens - 1)
    print(f"{model}: {calls} batched calls for {sequential_calls} sequential ones, "
          f"{skipped} steps skipped, {cut} cut")
    assert calls < 0.6 * sequential_calls, (calls, sequential_calls)  # batched
    if model == "built-in":  # steps with skips and steps with cuts were compared
        assert skipped > 50 and cut > 50, (skipped, cut)


def _views(n: int, prompt: int = 8000):
    return [RequestView(f"r{i}", float(i), prompt, computed_tokens=prompt // 2) for i in range(n)]


def _step(rule, views, budget=512, decodes=()):
    rule.begin_step(list(decodes), 256, budget)
    caps = plan_prefill_caps(FCFSPolicy(), views, iter(()), sum(n for _, n in decodes),
                             budget, 0, 10**9, True, rule=rule)
    return caps, rule.step_record()


@pytest.fixture
def linear(models):
    """4 ms + 0.15 ms per scheduled token."""
    return models["linear"]


def _rule(predictor, target_ms, apc=None, granularity=32):
    memory = KvCacheMemory(lambda: (100, 1900, 2**20))
    return LatencyChunkRule(LPRSConfig(enabled=True, target_ms=target_ms, granularity=granularity),
                            apc or APCConfig(enabled=False), predictor, memory, BLOCK, False)


def test_one_call_when_the_target_does_not_bind(linear):
    # Eight prompts with 40 tokens left: 4 + 0.15 * 320 = 52 ms < 100 ms; each takes all.
    caps, record = _step(_rule(linear, 100.0), _views(8, prompt=80))
    assert caps == {f"r{i}": 40 for i in range(8)}
    assert record["lprs_calls"] == 1


def test_two_calls_when_the_target_binds_at_the_first_candidate(linear):
    # 4 + 0.15 * 192 = 32.8 ms: the first prompt takes 192 of 512; every later one then
    # overflows with any chunk and takes 1 (LPRS alone).
    caps, record = _step(_rule(linear, 33.0), _views(8))
    assert caps == {"r0": 192, **{f"r{i}": 1 for i in range(1, 8)}}
    assert record["lprs_calls"] == 2
    assert record["lprs_rows"] == record["lprs_candidates"]  # no row was wasted


def test_a_step_like_the_last_one_needs_one_call(linear):
    """The look ahead assumes each request's proposal repeats where the target cut it in
    the step before: under steady load, one call."""
    rule, views = _rule(linear, 33.0), _views(8)
    assert _step(rule, views)[1]["lprs_calls"] == 2
    caps, record = _step(rule, views)
    assert caps == {"r0": 192, **{f"r{i}": 1 for i in range(1, 8)}}
    assert record["lprs_calls"] == 1


def test_two_calls_when_apc_holds_the_rest_back(linear):
    # The same with APC: the later candidates propose 1 < L_min and are held back.
    apc = APCConfig(enabled=True, max_active_prefills=8, min_chunk=16)
    caps, record = _step(_rule(linear, 33.0, apc), _views(8))
    assert caps == {"r0": 192, **{f"r{i}": 0 for i in range(1, 8)}}
    assert record["lprs_calls"] == 2


def test_a_failing_predictor_falls_back_for_the_step(linear, caplog):
    class Broken:
        def predict(self, rows):
            raise RuntimeError("session closed")

    rule = _rule(Broken(), 33.0)
    caps, record = _step(rule, _views(3))
    assert caps == {"r0": 512, "r1": 0, "r2": 0}
    assert record["lprs_fallback"] is True and rule.fallbacks == 1
    assert "session closed" in caplog.text


class Counting:
    """A predictor that counts its calls."""

    def __init__(self, predictor):
        self.predictor, self.calls = predictor, 0

    def predict(self, rows):
        self.calls += 1
        return self.predictor.predict(rows)

    def outside_range(self, row):
        return self.predictor.outside_range(row)


def test_the_dispatched_batch_reuses_the_prediction_made_while_planning(linear):
    """When vLLM dispatches the batch LPRS built, its prediction was made while planning:
    no second call. Any other batch is predicted on its own."""
    counting = Counting(linear)
    rule = _rule(counting, 33.0)
    rule.bias_ms = 2.0
    _step(rule, _views(3), decodes=[(100, 1), (50, 1)])
    planned = rule._batch
    calls = counting.calls
    fields = rule.dispatched(planned)
    assert counting.calls == calls  # reused
    expected = float(linear.predict(batch_row(planned, rule._memory_state)[None, :])[0])
    # With the 2 ms bias, 160 tokens (30.3 ms) beat 192 (35.1 ms); then 1 token each.
    assert fields["lprs_model_ms"] == expected == pytest.approx(4.0 + 0.15 * (2 + 160 + 1 + 1))
    assert fields["lprs_predicted_ms"] == expected + 2.0
    other = BatchStats(**{f: getattr(planned, f) for f in BatchStats.__slots__})
    other.add_decode(10)
    assert rule.dispatched(other)["lprs_model_ms"] == pytest.approx(expected + 0.15)
    assert counting.calls == calls + 1


def test_a_long_waiting_queue_is_pulled_only_as_far_as_the_budget_reaches(linear):
    pulled = []

    def waiting():
        for i in range(10**6):
            pulled.append(i)
            yield RequestView(f"w{i}", float(i), 10)

    for target in (1000.0, 10.0):  # not binding: 10 tokens each; binding: 1 token each
        pulled.clear()
        rule = _rule(linear, target)
        rule.begin_step([], 256, 512)
        caps = plan_prefill_caps(FCFSPolicy(), [], waiting(), 0, 512, 10**6, 10**9, True,
                                 rule=rule)
        # Binding, LPRS alone fragments the budget into one-token chunks: 476 requests.
        assert sum(caps.values()) == 512 and len(caps) == (52 if target > 100 else 476)
        assert len(pulled) <= len(caps) + 1, target  # what gets budget, and one to compare


def _prefill_step_ms(predictor, tokens: int, memory) -> float:
    stats = BatchStats()
    stats.add_prefill(tokens, 0)
    return float(predictor.predict(batch_row(stats, memory.read())[None, :])[0])


def test_the_automatic_target_is_the_predicted_time_of_a_prefill_step_of_the_budget(linear):
    memory = KvCacheMemory(lambda: (100, 1900, 2**20))
    rule = LatencyChunkRule(LPRSConfig(enabled=True), APCConfig(enabled=False), linear, memory,
                            BLOCK, False, token_budget=8192)
    assert rule.auto_target
    assert rule.params.target_ms == pytest.approx(_prefill_step_ms(linear, 4096, memory))
    # With a 2,048-token budget the target is a full step's time: a prompt alone takes the
    # whole budget, and decodes that would stretch that step make LPRS cut it.
    alone, record = _step(rule, [RequestView("r0", 0.0, 6000)], budget=2048)
    assert record["lprs_target_ms"] == pytest.approx(4.0 + 0.15 * 2048)
    assert alone == {"r0": 2048}
    with_decodes, _ = _step(rule, [RequestView("r0", 0.0, 6000)], budget=2048,
                            decodes=[(100, 1)] * 64)
    assert with_decodes == {"r0": 2048 - 64}


def test_the_automatic_target_follows_the_built_in_models_fit(models):
    memory = KvCacheMemory(lambda: (100, 1900, 2**20))
    model = RooflineLatencyModel(model_config("qwen3-8b"), accelerator("h100"), "test")
    rule = LatencyChunkRule(LPRSConfig(enabled=True), APCConfig(enabled=False), model, memory,
                            BLOCK, False, token_budget=8192)
    preset = rule.params.target_ms
    assert preset == pytest.approx(_prefill_step_ms(model, 4096, memory))
    # The engine turns out twice as slow as the preset: the fit, and the target, follow.
    rng = random.Random(3)
    for _ in range(200):
        stats = BatchStats()
        stats.add_prefill(rng.randint(1, 8192), rng.randint(0, 4000))
        for _ in range(rng.randint(0, 64)):
            stats.add_decode(rng.randint(1, 4000))
        row = batch_row(stats, memory.read())
        model.observe(row, 2.0 * float(roofline_ms(row[None, :], model.cfg, model.acc)[0]))
    rule.begin_step([], 256, 8192)
    assert rule.params.target_ms == pytest.approx(2.0 * preset, rel=0.02)
    assert rule.guard.target_ms == rule.params.target_ms


def test_a_cut_counts_only_when_the_planned_prefill_is_dispatched(linear):
    # The target binds (see above); if vLLM then admits none of the planned prefill (its
    # KV cache full, say), the step says nothing about the model and is not a cut.
    rule = _rule(linear, 33.0)
    _caps, record = _step(rule, _views(8))
    assert record["lprs_cut"]
    planned = BatchStats()
    planned.add_prefill(192, 4000)
    for _ in range(7):
        planned.add_prefill(1, 4000)
    assert rule.dispatched(planned)["lprs_cut"]
    assert not rule.dispatched(BatchStats())["lprs_cut"]
