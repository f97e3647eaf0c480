"""One scheduled step as the step-time models see it.

A model needs more than the 16 predictor features: an analytic model's attention cost is
a sum over sequences of ``chunk * context``, which aggregates cannot give. So the engine
hands every model this per-sequence description, and the ONNX model folds it into
:class:`~fairsched_plugin.predictor.features.BatchStats` itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .features import BatchStats


@dataclass(slots=True)
class SimBatch:
    """``prefills``: (chunk tokens, prompt tokens computed before the chunk) per prefill;
    ``decodes``: (context tokens, tokens scheduled) per decode."""

    prefills: list[tuple[int, int]] = field(default_factory=list)
    decodes: list[tuple[int, int]] = field(default_factory=list)

    @property
    def prefill_tokens(self) -> int:
        return sum(chunk for chunk, _ in self.prefills)

    @property
    def decode_tokens(self) -> int:
        return sum(tokens for _, tokens in self.decodes)

    @property
    def num_requests(self) -> int:
        return len(self.prefills) + len(self.decodes)

    def stats(self) -> BatchStats:
        """The seven batch features of the predictor (same accumulation as the adapter)."""
        stats = BatchStats()
        for chunk, processed in self.prefills:
            stats.add_prefill(chunk, processed)
        for context, tokens in self.decodes:
            stats.add_decode(context, tokens)
        return stats
