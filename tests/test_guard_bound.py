"""The guard's promise, checked by an independent oracle on vLLM's own scheduler.

Random traces (bursts, prompts up to 12 budgets long, aborts, preemption from a small KV
cache, vLLM priorities) are replayed step by step with fake model outputs. The oracle
shares nothing with the guard: it counts the served prefill work from each step's
``SchedulerOutput`` and vLLM's request state, reads each request's deadline once, when it
is given, and checks that

1. the deadline was feasible when set: at least the request's FCFS start (the work served
   so far plus every unfinished request's prefill work left, counted by the oracle);
2. the request was first scheduled at a step that began with at most its deadline plus
   one step's budget served, plus the work that preemptions put back into the queue
   after it arrived; under vLLM's priority scheduling, for the most urgent
   level (a less urgent one waits for every more urgent request, so nothing can be
   promised to it);
3. the oracle's served work equals the guard's.

And the check must bind: the same traces under the old rule (deadlines that only rank
once passed, no feasibility check) break bound 2, so the test can fail.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("vllm")

from vllm.v1.request import RequestStatus  # noqa: E402

from fairsched_plugin import FairScheduler, FairSyncScheduler  # noqa: E402
from fairsched_plugin.adapter.queue import PolicyRequestQueue  # noqa: E402
from fairsched_plugin.sim.fake_engine import make_request  # noqa: E402
from scheduler_driver import assert_nothing_left, scheduler_engine  # noqa: E402

BUDGET = 256


def _trace(seed: int, count: int, priorities: bool,
           max_output: int = 30) -> list[tuple[int, object]]:
    """(step, request): bursts of up to 12 at once, quiet gaps, a heavy-tailed prompt mix
    up to 3,000 tokens (12 budgets)."""
    rng = random.Random(seed)
    plan, step = [], 0
    for i in range(count):
        if rng.random() < 0.3:
            step += rng.choice((0, 1, 3, 10, 25))
        prompt = rng.choice((rng.randint(4, 60), rng.randint(60, 600), rng.randint(600, 3000)))
        plan.append((step, make_request(f"r{i}", prompt, rng.randint(1, max_output),
                                        arrival_time=1000.0 + step * 0.01 + i * 1e-6,
                                        priority=rng.choice((0, 1)) if priorities else 0)))
    return plan


class Oracle:
    """Served prefill work and the bound, from the scheduler's outputs alone."""

    def __init__(self, scheduler, slack_steps: int = 1, top_level_only: bool = False) -> None:
        self.scheduler = scheduler
        self.top_level_only = top_level_only
        self.slack_steps = slack_steps
        self.served = 0
        self.done: dict[str, int] = {}      # tokens scheduled since (re)admission
        self.target: dict[str, int] = {}    # tokens to compute: prompt, or recompute
        self.prompt: dict[str, int] = {}
        self.deadline: dict[str, float] = {}
        self.arrived_at_preemptions: dict[str, int] = {}
        self.put_back = 0                   # recomputed work added by preemptions so far
        self.late: list[str] = []
        self.started: set[str] = set()
        self.top_level: set[str] = set()

    def arrived(self, request) -> None:
        rid = request.request_id
        left = sum(self.target[r] - self.done[r] for r in self.target
                   if r in self.scheduler.requests and self.done[r] < self.target[r])
        deadline = self.scheduler._deadlines[rid]
        assert deadline >= self.served + left - 1e-6, (
            f"{rid}: deadline {deadline} before its FCFS start {self.served + left}")
        self.deadline[rid] = deadline
        if request.priority == 0:
            self.top_level.add(rid)
        self.arrived_at_preemptions[rid] = self.put_back
        self.done[rid], self.target[rid] = 0, request.num_prompt_tokens
        self.prompt[rid] = request.num_prompt_tokens

    def scheduled(self, output) -> None:
        for rid in output.preempted_req_ids:
            request = self.scheduler.requests[rid]
            self.done[rid], self.target[rid] = 0, request.num_tokens
            self.put_back += request.num_tokens
        served_before = self.served
        for new in output.scheduled_new_reqs:
            rid = new.req_id
            if rid in self.started:
                continue
            self.started.add(rid)
            if self.top_level_only and new.req_id not in self.top_level:
                continue
            allowed = (self.deadline[rid] + self.slack_steps * BUDGET
                       + self.put_back - self.arrived_at_preemptions[rid])
            if served_before > allowed:
                self.late.append(f"{rid}: started at {served_before} > {allowed:.0f}")
        for rid, n in output.num_scheduled_tokens.items():
            # Prefill while the prompt is not done or more than one token is left to
            # recompute (vLLM computes a request's last token as its decode).
            left = self.target[rid] - self.done[rid]
            if self.done[rid] < self.prompt[rid] or left > 1:
                self.served += n
            self.done[rid] += n

    def forget(self, rid: str) -> None:
        self.target.pop(rid, None)
        self.done.pop(rid, None)


def _replay(engine, trace, oracle: Oracle, abort_every: int, seed: int) -> None:
    scheduler = engine.scheduler
    pending = list(trace)
    rng = random.Random(seed)
    step = 0
    while pending or scheduler.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            request = pending.pop(0)[1]
            engine.add([request])
            oracle.arrived(request)
        record = engine.step()
        oracle.scheduled(record.output)
        for rid in list(oracle.target):
            if rid not in scheduler.requests:
                oracle.forget(rid)
        if abort_every and step % abort_every == abort_every - 1 and scheduler.requests:
            victim = rng.choice(sorted(scheduler.requests))
            scheduler.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
            oracle.forget(victim)
        step += 1
        assert step < 50_000
    engine.drain()


CASES = {
    # name: (scheduler class, KV blocks, abort every, vLLM scheduling policy, priorities)
    "bursts": (FairSyncScheduler, 4000, 0, "fcfs", False),
    "aborts": (FairSyncScheduler, 4000, 5, "fcfs", False),
    "preemption": (FairSyncScheduler, 240, 0, "fcfs", False),
    "priority-field": (FairSyncScheduler, 4000, 7, "fcfs", True),
    "priority-scheduling": (FairSyncScheduler, 4000, 7, "priority", True),
    "async": (FairScheduler, 4000, 9, "fcfs", False),
}


@pytest.mark.parametrize("slack", [1.0, 1.15, 2.0])
@pytest.mark.parametrize("case", sorted(CASES))
def test_no_request_starts_later_than_its_deadline_plus_one_step(config_only_model, case,
                                                                 slack):
    cls, blocks, abort_every, policy, priorities = CASES[case]
    put_back = 0
    for seed in range(2):
        engine = scheduler_engine(
            config_only_model, {"policy": "guarded-srpf",
                                "guarded_srpf": {"slack": slack, "size_allowance": 1.0,
                                                 "tail_window": 0, "overtake_running": True}},
            cls, budget=BUDGET, max_num_seqs=8, num_blocks=blocks, scheduling_policy=policy)
        oracle = Oracle(engine.scheduler, 1, top_level_only=policy == "priority")
        trace = _trace(seed, 120, priorities, 400 if case == "preemption" else 30)
        _replay(engine, trace, oracle, abort_every, seed)
        assert not oracle.late, oracle.late[:5]
        put_back += oracle.put_back
        assert oracle.served == engine.scheduler.fairsched_policy.guard.served
        assert_nothing_left(engine, blocks)
    assert put_back or case != "preemption", "the case must preempt"


def test_without_the_feasibility_check_requests_start_late(config_only_model, monkeypatch):
    """The oracle is not vacuous: the old guard (deadlines rank only once passed) lets
    requests start after their deadline plus a step on these traces."""
    monkeypatch.setattr(PolicyRequestQueue, "_may_pass", lambda self, *args: True)
    late = 0
    for seed in range(2):
        engine = scheduler_engine(
            config_only_model, {"policy": "guarded-srpf",
                                "guarded_srpf": {"slack": 1.0, "size_allowance": 1.0,
                                                 "tail_window": 0, "overtake_running": True}},
            FairSyncScheduler, budget=BUDGET, max_num_seqs=8, num_blocks=4000)
        oracle = Oracle(engine.scheduler, 1)
        _replay(engine, _trace(seed, 120, False), oracle, 0, seed)
        late += len(oracle.late)
    assert late > 0
