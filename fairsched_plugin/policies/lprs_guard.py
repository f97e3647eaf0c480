"""When LPRS should stop trusting its latency predictor, and when it may again.

LPRS is only as good as its predictor. A model trained on another engine, GPU, model or
vLLM version can be far off for every batch, and LPRS then throttles the engine: with a
model that predicts ten times the real step time, every candidate overflows the target and
takes one token, however far the online bias moves. The guard compares, over the last ``window`` dispatched
batches, what was predicted (with the bias) with the measured step time, and LPRS falls
back to the token-budget rule while

* the median relative error ``|measured - predicted| / measured`` is above ``max_error``
  (the model is far off on the batches it is asked about), or
* LPRS cut a chunk below the token budget's in more than half of those steps while their
  median measured time was below ``min_fill`` x the target: the model rejects bigger
  chunks as too slow, yet steps come in far under the target, so it over-predicts exactly
  the batches LPRS avoids, which no error on the dispatched batches can show.

While fallen back, the dispatched batches are still predicted, and LPRS recovers once the
median relative error over a fresh window is at most ``recover_error``. Each change
clears the window, so the next judgement is on batches built under the new rule.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class GuardParams:
    """The ``lprs.guard_*`` keys. Unlike the other parameter classes this one checks its
    own domain: its window must be >= 1, where config also accepts 0 (then no guard is
    built at all)."""

    window: int
    max_error: float
    recover_error: float
    min_fill: float

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"the guard's window must be >= 1, got {self.window}")
        if not 0 < self.recover_error <= self.max_error < math.inf:
            raise ValueError("the guard's errors must satisfy 0 < recover_error <= "
                             f"max_error, got {self.recover_error} and {self.max_error}")
        if not 0 <= self.min_fill <= 1:
            raise ValueError(f"the guard's min_fill must be in [0, 1], got {self.min_fill}")


class PredictionGuard:
    """The fall-back decision over a sliding window of dispatched batches."""

    def __init__(self, params: GuardParams, target_ms: float) -> None:
        self.params = params
        self.target_ms = target_ms
        self.fallen_back = False
        self._errors: deque[float] = deque(maxlen=params.window)
        self._measured: deque[float] = deque(maxlen=params.window)
        self._cut: deque[bool] = deque(maxlen=params.window)

    def observe(self, predicted_ms: float, measured_ms: float, cut: bool) -> str | None:
        """One dispatched batch: its predicted time (with the bias), its measured time,
        and whether LPRS cut a chunk below the token budget's in it. Returns why, when
        this batch makes the guard fall back or recover; None otherwise."""
        if not (math.isfinite(predicted_ms) and math.isfinite(measured_ms) and measured_ms > 0):
            return None
        self._errors.append(abs(measured_ms - predicted_ms) / measured_ms)
        self._measured.append(measured_ms)
        self._cut.append(cut)
        window = self.params.window
        if len(self._errors) < window:
            return None
        error = statistics.median(self._errors)
        measured = statistics.median(self._measured)
        if self.fallen_back:
            if error > self.params.recover_error:
                return None
            cause = (f"the median relative error of the last {window} predictions is "
                     f"{error:.2f}, at most lprs.guard_recover_error "
                     f"{self.params.recover_error:g}")
        elif error > self.params.max_error:
            cause = (f"the median relative error of the last {window} predictions is "
                     f"{error:.2f} (median measured step {measured:.1f} ms), above "
                     f"lprs.guard_max_error {self.params.max_error:g}")
        elif (sum(self._cut) * 2 > window
              and measured < self.params.min_fill * self.target_ms):
            cause = (f"LPRS cut chunks in {sum(self._cut)} of the last {window} steps while "
                     f"they took a median of {measured:.1f} ms, under lprs.guard_min_fill "
                     f"{self.params.min_fill:g} x the {self.target_ms:g} ms target: the "
                     "predictor over-predicts the batches LPRS avoids")
        else:
            return None
        self.fallen_back = not self.fallen_back
        self._errors.clear()
        self._measured.clear()
        self._cut.clear()
        return cause
