"""The simulator's virtual clock: the one notion of "now" for an arm's run."""

from __future__ import annotations


class VirtualClock:
    """Seconds since the run started; moved only by the engine loop. Calling it reads it,
    so it can stand wherever a ``time.time``-like callable is expected (the plugin's
    scheduler and step monitor take it as ``clock``)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"the virtual clock cannot go back ({seconds} s)")
        self.now += seconds

    def jump_to(self, t: float) -> None:
        """Idle until ``t`` (no-op when ``t`` is already past)."""
        self.now = max(self.now, t)
