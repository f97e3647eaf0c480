"""The configuration's shape: one frozen dataclass per section, with its defaults.

The bottom layer of the package: the policies and the plan take their sections from here,
and ``config`` (which reads the policy registry to check the ``policy`` key, so sits
above the policies) loads, checks and re-exports these classes. Nothing here checks a
value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

AUTO = "auto"


@dataclass(frozen=True)
class AgingConfig:
    """Aging's parameters. ``alpha`` defaults to the automatic setting with factor 0.25,
    the setting that measured best on the CPU engine."""

    alpha: float | str = AUTO
    beta: float = -1.0
    auto_factor: float = 0.25


@dataclass(frozen=True)
class GuardedSRPFConfig:
    """Guarded shortest remaining prefill first, the default: a request is overdue once
    the engine has served ``slack`` times the prefill work FCFS would have served before
    it (or the largest backlog of the last ``window_s`` seconds) plus ``size_allowance``
    times its own prefill work; overdue requests outrank the rest. Slack 1.15 and
    allowance 1 were chosen on the scenario suite (docs/policies.md, "Choosing the
    default")."""

    slack: float = 1.15
    window_s: float = 0.0
    size_allowance: float = 1.0
    persist_s: float = 0.0
    tail_window: int = 200
    """Requests over which the guard compares its TTFT and TPOT tails with FCFS's and
    steps back towards arrival order when either is longer (``policies.tail_watch``); 0:
    no watch."""
    overtake_running: bool = False
    """Whether a waiting request may take budget from a running prefill it ranks ahead of.
    Off, a prefill once started finishes at stock vLLM's pace, so a long prompt is not
    slowed by the short ones arriving during its prefill (``OrderingPolicy.running_first``)."""


@dataclass(frozen=True)
class GuardedAgingConfig:
    """Aging (alpha ``auto_factor`` times the measured prefill throughput) inside the
    guard of guarded-srpf, with its own ``slack`` and ``window_s``. Slack 1.25: in six
    paired comparisons with slack 1 on the real CPU engine its median TTFT was 0.60-0.99x
    of slack 1's for a P99 TTFT 0.98-1.06x of it."""

    slack: float = 1.25
    window_s: float = 0.0
    auto_factor: float = 0.25
    size_allowance: float = 0.0
    persist_s: float = 0.0


@dataclass(frozen=True)
class PreflowConfig:
    """PREFLOW: a request's priority doubles every ``age_doubling_s`` seconds it waits."""

    age_doubling_s: float = 1.0


@dataclass(frozen=True)
class AgingSPFConfig:
    """Aging shortest-prompt-first: ``rate`` prompt tokens of priority per second waited."""

    rate: float = 100.0


@dataclass(frozen=True)
class ESTFConfig:
    """Estimated shortest tokens first: the estimate before ``min_samples`` completions."""

    prior_output_tokens: float = 128.0
    min_samples: int = 5


@dataclass(frozen=True)
class AFLCBConfig:
    """Adaptive fair LCB (formula in docs/policies.md)."""

    z: float = 1.0
    prompt_weight: float = 0.1
    age_rate: float = 50.0
    tier_weight: float = 256.0
    tier_half_life_s: float = 10.0
    kv_threshold: float = 0.8
    kv_weight: float = 1.0


@dataclass(frozen=True)
class ProfileConfig:
    """Per-step profiling for the latency predictor: off while ``path`` is empty."""

    path: str = ""
    memory: str = "auto"


@dataclass(frozen=True)
class PredictorConfig:
    """The ONNX latency model and how ONNX Runtime runs it."""

    path: str = ""
    provider: str = "cpu"
    device_id: int = 0
    threads: int = 1
    allow_memory_mismatch: bool = False
    precision_mode: str = "must_keep_origin_dtype"
    """CANN provider only: the graph's precision (CANN's own default, fp16, overflows)."""
    model: str = "auto"
    """Without ``path``: the served model the built-in latency model assumes ("auto":
    vLLM's model config; or a preset name or a config.json path)."""
    device: str = "auto"
    """Without ``path``: the accelerator preset the built-in model starts from ("auto":
    the detected device; or a preset with optional ``field=value`` overrides)."""


@dataclass(frozen=True)
class LPRSConfig:
    """Latency-predictive chunk selection (seed 000 §3.2.2): per prefill candidate, the
    chunk whose predicted batch time is closest to ``target_ms`` (asymmetric penalties).
    ``guard_*``: when to stop trusting a predictor that does not fit the engine
    (``policies.lprs_guard``)."""

    enabled: bool | str = "auto"
    """"auto": on with ``predictor.path``'s fitted model unless the policy is ``fcfs``
    (resolved when the config is loaded)."""
    target_ms: float | str = AUTO
    """"auto": the predicted time of a step prefilling 4,096 tokens (at most the token
    budget) and nothing else (``policies.lprs.AUTO_TARGET_TOKENS`` says why); or a fixed
    time in ms."""
    granularity: int = 32
    underfill_penalty: float = 1.0
    overflow_penalty: float = 4.0
    align: str = "auto"
    correction: float = 0.1
    guard_window: int = 16
    guard_max_error: float = 1.0
    guard_recover_error: float = 0.5
    guard_min_fill: float = 0.5


@dataclass(frozen=True)
class APCConfig:
    """Active prefill control (seed 000 §3.3): a dynamic cap on active prefills, a minimum
    useful chunk, warm start, and a bound on how long one prefill can be held back."""

    enabled: bool | str = "auto"
    """"auto": on with ``predictor.path``'s fitted model unless the policy is ``fcfs``
    (resolved when the config is loaded)."""
    max_active_prefills: int = 8
    min_chunk: int = 16
    max_deferred_steps: int = 64


@dataclass(frozen=True)
class MetricsConfig:
    """The ``fairsched:`` series on vLLM's ``/metrics`` and the ``GET /fairsched`` view.

    The engine core writes its counters to a snapshot file at most every ``interval_s``
    (and when it falls idle), so the per-step work is counting only (``metrics.snapshot``
    says why a file). Requests are classed by prompt tokens at ``class_edges``."""

    enabled: bool = True
    dir: str = ""
    interval_s: float = 1.0
    class_edges: str = "128,1024"
    live_view: bool = False


@dataclass(frozen=True)
class FairschedConfig:
    """The whole ``fairsched`` section: the top-level keys and one field per section."""

    policy: str = "guarded-srpf"
    service: str = "budget"
    max_batch_size: int = 16
    decodes_first: bool = False
    decode_share: float = 0.0
    decode_share_max_tpot_ms: float = 0.0
    prefix_aware: bool = True
    guarded_srpf: GuardedSRPFConfig = field(default_factory=GuardedSRPFConfig)
    guarded_aging: GuardedAgingConfig = field(default_factory=GuardedAgingConfig)
    aging: AgingConfig = field(default_factory=AgingConfig)
    preflow: PreflowConfig = field(default_factory=PreflowConfig)
    aging_spf: AgingSPFConfig = field(default_factory=AgingSPFConfig)
    estf: ESTFConfig = field(default_factory=ESTFConfig)
    af_lcb: AFLCBConfig = field(default_factory=AFLCBConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    lprs: LPRSConfig = field(default_factory=LPRSConfig)
    apc: APCConfig = field(default_factory=APCConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    trace_path: str = ""
