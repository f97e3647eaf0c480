"""The EDF slack tree against a brute-force oracle: random insertions, removals and
window moves, every prefix query compared with a direct sum over the requests."""

from __future__ import annotations

import math
import random

import pytest

from fairsched_plugin.policies.slack_tree import SlackTree


def brute_least_slack_before(items: dict[int, tuple[float, int]], position: int) -> float:
    least, before = math.inf, 0
    for p in sorted(items):
        if p >= position:
            break
        deadline, work = items[p]
        least = min(least, deadline - before)
        before += work
    return least


@pytest.mark.parametrize("seed", range(6))
def test_prefix_slack_matches_a_direct_sum(seed):
    rng = random.Random(seed)
    tree, items = SlackTree(capacity=4), {}
    next_position = rng.randrange(0, 50)
    for _ in range(1500):
        action = rng.random()
        if action < 0.5 or not items:
            position = next_position
            next_position += rng.choice((1, 1, 1, 2, 7))
            if items and rng.random() < 0.1:  # a request coming back to its old place
                position = rng.randrange(min(items), max(items) + 1)
            deadline, work = rng.uniform(0, 1e5), rng.randrange(1, 5000)
            tree.put(position, deadline, work)
            items[position] = (deadline, work)
        else:
            position = rng.choice(list(items)) if rng.random() < 0.9 else -5
            tree.remove(position)
            items.pop(position, None)
        assert len(tree) == len(items)
        assert tree.work == sum(w for _d, w in items.values())
        for probe in rng.sample(range(-3, next_position + 3), 5) + [next_position]:
            assert tree.least_slack_before(probe) == pytest.approx(
                brute_least_slack_before(items, probe))
