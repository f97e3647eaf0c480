"""The ordering policies (the chunked-prefill paper, section 3.1, Eq. 1-4), without vLLM.

Numbers are chosen so that every product below is exact in binary floating point
(arrival times are multiples of 1/8, token counts are integers), so equalities are exact.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from dataclasses import replace

import pytest

from fairsched_plugin.config import from_values
from fairsched_plugin.policies import (
    AgingPolicy,
    FCFSPolicy,
    RequestView,
    make_policy,
    plan_prefill_caps,
)
from fairsched_plugin.policies.aging import DEFAULT_ALPHA, DEFAULT_BETA


def view(rid: str, arrival: float, prompt: int, computed: int = 0, output: int = 0) -> RequestView:
    return RequestView(
        request_id=rid,
        arrival_time=arrival,
        prompt_tokens=prompt,
        computed_tokens=computed,
        output_tokens=output,
    )


def ids(views) -> list[str]:
    return [v.request_id for v in views]


# --------------------------------------------------------------------------- views


def test_policy_layer_does_not_import_vllm():
    code = (
        "import sys, fairsched_plugin.policies, fairsched_plugin.config;"
        "bad = sorted(m for m in ('vllm', 'torch') if m in sys.modules);"
        "assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_step_plan_imports_no_onnx_runtime():
    """LPRS's chunk rule lives in the policy layer; the latency model reaches it only
    through ``BatchLatencyModel``."""
    code = (
        "import sys, fairsched_plugin.policies.plan;"
        "bad = sorted(m for m in ('vllm', 'onnxruntime', 'fairsched_plugin.predictor.runtime')"
        " if m in sys.modules);"
        "assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_request_view_remaining_prefill():
    assert view("a", 0.0, 100).remaining_prefill == 100
    assert view("a", 0.0, 100, computed=40).remaining_prefill == 60
    # A preempted request recomputes prompt + output: 100 + 20 - 0.
    assert view("a", 0.0, 100, output=20).num_tokens == 120
    assert view("a", 0.0, 100, output=20).remaining_prefill == 120
    # Never negative.
    assert view("a", 0.0, 100, computed=150).remaining_prefill == 0


# --------------------------------------------------------------------------- Aging keys


def test_aging_defaults():
    policy = AgingPolicy()
    assert (policy.alpha, policy.beta) == (DEFAULT_ALPHA, DEFAULT_BETA) == (37.5, -1.0)
    assert policy.name == "aging"
    assert policy.describe() == "aging(alpha=37.5, beta=-1)"


@pytest.mark.parametrize(
    ("alpha", "beta", "arrival", "prompt", "computed", "expected_value"),
    [
        # value = alpha * a - beta * r  (= -K of Eq. 4)
        (37.5, -1.0, 2.0, 100, 0, 37.5 * 2.0 + 100),  # 175.0
        (37.5, -1.0, 2.0, 100, 40, 75.0 + 60),  # 135.0: progress lowers the value
        (2.0, -0.5, 10.0, 64, 0, 20.0 + 32.0),  # 52.0
        (1.0, -3.0, 0.0, 7, 0, 21.0),
        (4.0, -1.0, 0.125, 0, 0, 0.5),  # no remaining work: age term only
    ],
)
def test_aging_value_hand_computed(alpha, beta, arrival, prompt, computed, expected_value):
    policy = AgingPolicy(alpha=alpha, beta=beta)
    v = view("r", arrival, prompt, computed)
    assert policy.value(v) == expected_value
    # The paper's Eq. 4 key is the negation of our min-ordered value.
    k_eq4 = -alpha * arrival + beta * v.remaining_prefill
    assert policy.value(v) == -k_eq4
    assert policy.key(v) == (expected_value, arrival, "r")


def test_aging_value_hand_computed_literals():
    policy = AgingPolicy(alpha=37.5, beta=-1.0)
    assert policy.value(view("x", 2.0, 100)) == 175.0
    assert policy.value(view("x", 2.0, 100, computed=40)) == 135.0
    assert AgingPolicy(alpha=2.0, beta=-0.5).value(view("x", 10.0, 64)) == 52.0


@pytest.mark.parametrize(
    ("alpha", "beta", "now", "arrival", "remaining", "expected"),
    [
        # P = alpha * (now - a) + beta * r   (Eq. 1)
        (37.5, -1.0, 3.0, 1.0, 100, 75.0 - 100),  # -25.0
        (37.5, -1.0, 5.0, 1.0, 100, 150.0 - 100),  # 50.0: waiting raises priority
        (2.0, -0.5, 10.0, 10.0, 64, -32.0),  # just arrived: work term only
        (1.0, -1.0, 0.0, 4.0, 0, -4.0),  # "now" before arrival is still a number
    ],
)
def test_aging_priority_eq1(alpha, beta, now, arrival, remaining, expected):
    policy = AgingPolicy(alpha=alpha, beta=beta)
    assert policy.priority(view("r", arrival, remaining), now) == expected


def test_aging_priority_is_alpha_now_minus_value():
    # Eq. 3: P = alpha * t + K, and K = -value.
    policy = AgingPolicy(alpha=37.5, beta=-1.0)
    v = view("r", 1.5, 300, computed=44)
    for now in (0.0, 1.5, 2.0, 100.25):
        assert policy.priority(v, now) == 37.5 * now - policy.value(v)


def _random_views(rng: random.Random, n: int) -> list[RequestView]:
    views = []
    for i in range(n):
        prompt = rng.randint(1, 4000)
        views.append(
            view(
                f"r{i:03d}",
                arrival=rng.randint(0, 800) / 8,  # 0 .. 100 s in 1/8 s steps (exact)
                prompt=prompt,
                computed=rng.randint(0, prompt),
            )
        )
    # A few deliberate exact ties on (value, arrival) and on value alone.
    views.append(replace(views[0], request_id="tie-same-everything"))
    views.append(view("tie-value-only", views[1].arrival_time + 1.0, 1))
    return views


@pytest.mark.parametrize(
    ("alpha", "beta"), [(37.5, -1.0), (2.0, -0.5), (0.125, -4.0), (1000.0, -1.0)]
)
def test_sorting_by_key_equals_sorting_by_eq1_priority(alpha, beta):
    rng = random.Random(1234)
    policy = AgingPolicy(alpha=alpha, beta=beta)
    views = _random_views(rng, 200)
    by_key = ids(sorted(views, key=policy.key))
    for now in (0.0, 0.5, 50.0, 100.0, 1e4, -7.25):
        by_priority = ids(
            sorted(views, key=lambda v: (-policy.priority(v, now), v.arrival_time, v.request_id))
        )
        assert by_key == by_priority, f"order differs at now={now}"


def test_key_does_not_depend_on_time_but_priority_does():
    policy = AgingPolicy(alpha=37.5, beta=-1.0)
    v = view("r", 1.0, 100)
    assert policy.priority(v, 2.0) != policy.priority(v, 3.0)
    assert policy.key(v) == policy.key(v) == (137.5, 1.0, "r")


# --------------------------------------------------------------------------- tie-breaks


def test_tie_break_equal_value_earlier_arrival_first():
    policy = AgingPolicy(alpha=1.0, beta=-1.0)
    early_long = view("z-early", 0.0, 10)  # value 0 + 10 = 10
    late_short = view("a-late", 5.0, 5)  # value 5 + 5 = 10
    assert policy.value(early_long) == policy.value(late_short) == 10.0
    assert ids(sorted([late_short, early_long], key=policy.key)) == ["z-early", "a-late"]


def test_tie_break_equal_value_and_arrival_smaller_id_first():
    policy = AgingPolicy(alpha=1.0, beta=-1.0)
    b = view("req-b", 3.0, 7)
    a = view("req-a", 3.0, 7)
    c = view("req-c", 3.0, 7)
    assert ids(sorted([b, c, a], key=policy.key)) == ["req-a", "req-b", "req-c"]


def test_fcfs_tie_break_by_id():
    policy = FCFSPolicy()
    views = [view("b", 1.0, 10), view("a", 1.0, 999), view("c", 0.5, 10)]
    assert ids(sorted(views, key=policy.key)) == ["c", "a", "b"]


# --------------------------------------------------------------------------- alpha/|beta|

# Arrival and remaining work are anti-correlated: the earliest request has the most work.
_RATIO_VIEWS = [
    view("first-longest", 0.0, 4000),
    view("second", 10.0, 2000),
    view("third", 20.0, 900),
    view("fourth", 30.0, 50),
    view("last-shortest", 40.0, 1),
]


def test_small_ratio_is_shortest_remaining_first():
    # alpha * 40 s = 4e-5 is far below one token of remaining work.
    policy = AgingPolicy(alpha=1e-6, beta=-1.0)
    order = ids(sorted(_RATIO_VIEWS, key=policy.key))
    assert order == ids(sorted(_RATIO_VIEWS, key=lambda v: v.remaining_prefill))
    assert order == ["last-shortest", "fourth", "third", "second", "first-longest"]


def test_large_ratio_is_arrival_order():
    # 10 s of arrival gap is worth 1e7 tokens, far above the 4000-token work spread.
    policy = AgingPolicy(alpha=1e6, beta=-1.0)
    order = ids(sorted(_RATIO_VIEWS, key=policy.key))
    assert order == ids(sorted(_RATIO_VIEWS, key=FCFSPolicy().key))
    assert order == ["first-longest", "second", "third", "fourth", "last-shortest"]


def test_only_the_ratio_matters():
    # Scaling alpha and beta together scales every value: same order.
    rng = random.Random(7)
    views = _random_views(rng, 100)
    base = ids(sorted(views, key=AgingPolicy(alpha=3.0, beta=-0.5).key))
    assert base == ids(sorted(views, key=AgingPolicy(alpha=12.0, beta=-2.0).key))


def test_intermediate_ratio_mixes():
    # alpha/|beta| = 100 tokens per second: a 50-token request 10 s late (value 1050)
    # beats a 2000-token request at 0 (2000) but not a 900-token one at 0 (900).
    policy = AgingPolicy(alpha=100.0, beta=-1.0)
    views = [view("long", 0.0, 2000), view("mid", 0.0, 900), view("short-late", 10.0, 50)]
    assert [policy.value(v) for v in views] == [2000.0, 900.0, 1050.0]
    assert ids(sorted(views, key=policy.key)) == ["mid", "short-late", "long"]


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("alpha", [0.0, -0.0, -1.0, math.nan, math.inf, -math.inf])
def test_invalid_alpha_rejected(alpha):
    with pytest.raises(ValueError, match=r"aging\.alpha must be a finite number > 0"):
        make_policy(from_values({"policy": "aging", "aging": {"alpha": alpha, "beta": -1.0}}))


@pytest.mark.parametrize("beta", [0.0, -0.0, 1.0, math.nan, math.inf, -math.inf])
def test_invalid_beta_rejected(beta):
    with pytest.raises(ValueError, match=r"aging\.beta must be a finite number < 0"):
        make_policy(from_values({"policy": "aging", "aging": {"alpha": 1.0, "beta": beta}}))


def test_tiny_but_valid_parameters_accepted():
    policy = AgingPolicy(alpha=1e-300, beta=-1e-300)
    assert policy.alpha == 1e-300 and policy.beta == -1e-300


# --------------------------------------------------------------------------- overtake delay


def test_overtake_delay_formula():
    # -beta * (r_long - r_short) / alpha
    assert AgingPolicy(alpha=37.5, beta=-1.0).overtake_delay(1000, 100) == 24.0  # 900 / 37.5
    assert AgingPolicy(alpha=4.0, beta=-2.0).overtake_delay(500, 100) == 200.0  # 2*400/4
    assert AgingPolicy(alpha=1000.0, beta=-1.0).overtake_delay(1000, 100) == 0.9
    # A "long" request that is not longer needs no wait.
    assert AgingPolicy(alpha=1.0, beta=-1.0).overtake_delay(100, 100) == 0.0
    assert AgingPolicy(alpha=1.0, beta=-1.0).overtake_delay(100, 1000) == 0.0


def test_overtake_delay_is_the_crossover_of_keys():
    policy = AgingPolicy(alpha=4.0, beta=-2.0)
    delay = policy.overtake_delay(500, 100)  # 200 s
    long = view("long", 0.0, 500)
    exactly = view("short-at", delay, 100)  # tie on value: the earlier arrival wins
    after = view("short-after", delay + 0.125, 100)
    before = view("short-before", delay - 0.125, 100)
    assert policy.value(long) == policy.value(exactly) == 1000.0
    assert policy.key(long) < policy.key(exactly)
    assert policy.key(long) < policy.key(after)
    assert policy.key(before) < policy.key(long)


# --------------------------------------------------------------------------- FCFS


def test_fcfs_orders_by_arrival_regardless_of_work():
    policy = FCFSPolicy()
    views = [
        view("c", 3.0, 1),
        view("a", 1.0, 5000),
        view("b", 2.0, 10, computed=5),
        view("d", 4.0, 100, output=30),
    ]
    assert ids(sorted(views, key=policy.key)) == ["a", "b", "c", "d"]
    assert policy.value(views[0]) == 3.0
    assert policy.key(views[1]) == (1.0, 1.0, "a")
    assert policy.name == policy.describe() == "fcfs"


# --------------------------------------------------------------------------- starvation


DT = 0.01
BUDGET = 100
SHORT = 100
LONG = 1000


def simulate(policy, steps: int) -> dict[str, tuple[int | None, int | None]]:
    """A virtual-clock engine loop around ``plan_prefill_caps``.

    Step ``n`` runs at ``t = n * DT``. A short request of ``SHORT`` tokens arrives at every
    step, and one ``LONG`` request at ``t = 0``. Each step: running partial prefills get
    their caps from the plan; then waiting requests, kept sorted by the policy key, are
    admitted in order with ``min(remaining, budget left)`` (what vLLM's waiting loop does
    with the budget the plan left free). Decodes are ignored: a request is done when its
    prefill completes. No slot or KV limit.

    Returns ``{request_id: (first step served, step its prefill completed)}``.
    """
    running: dict[str, RequestView] = {}
    waiting: list[RequestView] = []
    first: dict[str, int] = {}
    done: dict[str, int] = {}

    def progress(v: RequestView, chunk: int, step: int) -> RequestView:
        first.setdefault(v.request_id, step)
        v = replace(v, computed_tokens=v.computed_tokens + chunk)
        if v.remaining_prefill == 0:
            done[v.request_id] = step
        return v

    for step in range(steps):
        now = step * DT
        if step == 0:
            waiting.append(view("long", 0.0, LONG))
        waiting.append(view(f"short{step:04d}", now, SHORT))
        waiting.sort(key=policy.key)

        caps = plan_prefill_caps(
            policy,
            list(running.values()),
            iter(waiting),
            decode_tokens=0,
            token_budget=BUDGET,
            free_slots=10**6,
            free_kv_tokens=10**12,
        )
        assert set(caps) == set(running)
        left = BUDGET
        for rid, cap in caps.items():
            if cap:
                running[rid] = progress(running[rid], cap, step)
                left -= cap
        assert left >= 0
        while waiting and left > 0:
            v = waiting.pop(0)
            chunk = min(v.remaining_prefill, left)
            left -= chunk
            running[v.request_id] = progress(v, chunk, step)
        for rid in [rid for rid, v in running.items() if v.remaining_prefill == 0]:
            del running[rid]
    return {rid: (first.get(rid), done.get(rid)) for rid in set(first) | {"long"}}


def test_simulator_under_fcfs():
    # Sanity check of the simulator. "long" and "short0000" both arrive at t=0; the id
    # breaks the tie, so FCFS runs the long prefill first, in ten full chunks (steps 0-9),
    # and every short then waits ten steps behind it, one short per step.
    result = simulate(FCFSPolicy(), steps=30)
    assert result["long"] == (0, 9)
    for n in range(20):
        assert result[f"short{n:04d}"] == (n + 10, n + 10)


def test_aging_does_not_starve_a_long_prefill():
    policy = AgingPolicy(alpha=1000.0, beta=-1.0)
    delay = policy.overtake_delay(LONG, SHORT)
    assert delay == 0.9  # 900 tokens / 1000 per second
    horizon = math.ceil(delay / DT) + 2 + math.ceil(LONG / BUDGET) + 2 + 5
    result = simulate(policy, steps=horizon)
    first, done = result["long"]
    assert first is not None, "the long request was never served"
    # Shorts arriving at t >= 0.9 s rank behind it: its first chunk is at step 90.
    assert first * DT <= delay + 2 * DT
    assert first == 90
    # Once running, its shrinking remainder keeps it ahead: ten full chunks.
    assert done is not None
    assert done - first <= math.ceil(LONG / BUDGET) + 2
    assert done == 99
    # Before the crossover the shorts were served as they came (one per step).
    assert all(result[f"short{n:04d}"] == (n, n) for n in range(90))


def test_tiny_alpha_starves_the_long_prefill_in_the_same_horizon():
    policy = AgingPolicy(alpha=0.001, beta=-1.0)
    reference_delay = AgingPolicy(alpha=1000.0, beta=-1.0).overtake_delay(LONG, SHORT)
    horizon = math.ceil(reference_delay / DT) + 2 + math.ceil(LONG / BUDGET) + 2 + 5
    result = simulate(policy, steps=horizon)
    assert result["long"] == (None, None)
    # Its own crossover is 900 / 0.001 = 900000 s away.
    assert policy.overtake_delay(LONG, SHORT) == 900_000.0
    # Every step went to the short that arrived in it.
    assert all(result[f"short{n:04d}"] == (n, n) for n in range(horizon))
