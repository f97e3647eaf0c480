"""Earliest-deadline-first feasibility of a waiting queue, in O(log n) per change or query.

Waiting requests sit at positions in deadline order, each with its deadline ``d`` and its
remaining prefill work ``w``. Served in that order, request ``k`` starts once the work
ahead of the queue (``base``) and the work of every request before it are done, so its
*slack* is

    slack_k = d_k - base - sum(w_j for j before k)

and the queue is feasible (every request starts by its deadline) while every slack is at
least 0. Letting a request with work ``w`` go ahead of the requests before position ``p``
costs each of them ``w`` of slack: it is safe while :meth:`SlackTree.least_slack_before`
``(p) - base >= w`` (the "slack stealing" test of real-time schedulers).

The tree is a segment tree over positions: each node keeps its work ``W`` and the least
``d - (work before, inside the node)`` of its leaves, ``M``; a node's ``M`` is
``min(M_left, M_right - W_left)``, so an insertion, removal or prefix query walks one path.
Positions are the caller's (arrival order of monotone deadlines); the tree covers a window
of them and is rebuilt, with the window moved and resized, when a position falls outside.
"""

from __future__ import annotations

import math

_EMPTY = math.inf


class SlackTree:
    """Deadlines and work at integer positions, with EDF slack queries (module docstring)."""

    def __init__(self, capacity: int = 256) -> None:
        self._items: dict[int, tuple[float, int]] = {}
        self._offset = 0
        self._build(max(capacity, 2), {})

    def __len__(self) -> int:
        return len(self._items)

    @property
    def work(self) -> int:
        """The work of every request in the tree."""
        return self._work[1]

    def put(self, position: int, deadline: float, work: int) -> None:
        """Add (or replace) the request at ``position``."""
        if not self._offset <= position < self._offset + self._size:
            self._items[position] = (deadline, work)
            self._rebuild()
            return
        self._items[position] = (deadline, work)
        self._set(position - self._offset, deadline, work)

    def remove(self, position: int) -> None:
        """Take the request at ``position`` out (no-op when there is none)."""
        if self._items.pop(position, None) is not None:
            self._set(position - self._offset, _EMPTY, 0)

    def least_slack_before(self, position: int) -> float:
        """``min(d_k - work before k)`` over the requests before ``position`` (infinite when
        there are none); subtract ``base`` for their least slack."""
        index = position - self._offset
        if index <= 0:
            return _EMPTY
        if index >= self._size:
            return self._least[1]
        least_, work_ = self._least, self._work
        least, before = _EMPTY, 0
        node, low, size = 1, 0, self._size
        while index < low + size:  # the node is partly before the position
            half = size >> 1
            left = node << 1
            if index >= low + half:  # its left half wholly before it
                value = least_[left] - before
                if value < least:
                    least = value
                before += work_[left]
                node, low = left + 1, low + half
                if index == low:
                    return least
            else:
                node = left
            size = half
        value = least_[node] - before
        return value if value < least else least

    def _set(self, index: int, deadline: float, work: int) -> None:
        node = index + self._size
        least_, work_ = self._least, self._work
        least_[node] = deadline
        work_[node] = work
        node >>= 1
        while node:
            left = node << 1
            w_left = work_[left]
            right_least = least_[left + 1] - w_left
            left_least = least_[left]
            least_[node] = left_least if left_least < right_least else right_least
            work_[node] = w_left + work_[left + 1]
            node >>= 1

    def _rebuild(self) -> None:
        """Move the window to the live positions, at twice their span."""
        low, high = min(self._items), max(self._items)
        size = 2
        while size < 2 * (high - low + 1):
            size <<= 1
        self._offset = low
        self._build(size, self._items)

    def _build(self, size: int, items: dict[int, tuple[float, int]]) -> None:
        self._size = size
        self._least = [_EMPTY] * (2 * size)
        self._work = [0] * (2 * size)
        for position, (deadline, work) in items.items():
            index = position - self._offset + size
            self._least[index] = deadline
            self._work[index] = work
        least_, work_ = self._least, self._work
        for node in range(size - 1, 0, -1):
            left = node << 1
            least_[node] = min(least_[left], least_[left + 1] - work_[left])
            work_[node] = work_[left] + work_[left + 1]
