"""Every setting of the plugin, each declared once: its field carries the type, the default,
what it accepts, the check and the docs link.

The bottom layer of the package: the policies and the plan take their sections from here.
``config`` (which reads the policy registry to check the ``policy`` key, so sits above the
policies) derives everything else from these fields: the dotted keys, the ``FAIRSCHED_*``
variables, ``check-config --list-keys`` and the docs' configuration table. A new setting
is one :func:`setting` field in its section.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

AUTO = "auto"
SETTING = "fairsched"
"""The dataclass field metadata key that holds a field's :class:`Setting`."""
SERVICE_MODES = ("budget", "ranked")
MEMORY_PROVIDERS = ("auto", "torch", "nvml", "kv_cache")
PREDICTOR_PROVIDERS = ("cpu", "cuda", "cann")
CANN_PRECISION_MODES = ("must_keep_origin_dtype", "force_fp32", "force_fp16",
                        "allow_fp32_to_fp16", "allow_mix_precision")
"""The CANN execution provider's precision modes (ONNX Runtime 1.24); the first keeps the
MLP in fp32, which its unnormalised interaction features need."""
ALIGN_MODES = ("auto", "on", "off")


def _any(_value: Any) -> bool:
    return True


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Setting:
    """How one setting is checked and documented."""

    accepted: str
    """What the key accepts, for messages and the docs."""
    check: Callable[[Any], bool] = _any
    """Whether a value of the field's type is accepted (run once, when loaded)."""
    normalise: Callable[[Any], Any] = _same
    """Applied to a string value before the check (``str.lower``: names in any case)."""
    allow_auto: bool = False
    """Also accepts ``"auto"``, beside values of the field's type."""
    choices: tuple[str, ...] = ()
    """The accepted names of a key that takes one of a few, to suggest the closest."""
    see: str = ""
    """A docs page (relative to the repository root) the configuration table links to."""


def setting(default: Any, accepted: str, check: Callable[[Any], bool] = _any, *,
            normalise: Callable[[Any], Any] = _same, allow_auto: bool = False,
            choices: tuple[str, ...] = (), see: str = "") -> Any:
    """A section field with its default and its :class:`Setting`."""
    return field(default=default, metadata={SETTING: Setting(
        accepted, check, normalise, allow_auto, choices, see)})


def choice_of(names: tuple[str, ...]) -> dict[str, Any]:
    """A :class:`Setting`'s ``accepted``, ``check`` and ``choices`` for one of ``names``."""
    return {"accepted": "one of " + ", ".join(names), "check": names.__contains__,
            "choices": names}


def one_of(default: str, names: tuple[str, ...], see: str = "") -> Any:
    """A string setting that takes one of ``names``, in any case."""
    return field(default=default, metadata={SETTING: Setting(
        normalise=str.lower, see=see, **choice_of(names))})


def finite(value: float) -> bool:
    return math.isfinite(value)


def positive(value: float) -> bool:
    return finite(value) and value > 0


def non_negative(value: float) -> bool:
    return finite(value) and value >= 0


def at_least_one(value: int) -> bool:
    return value >= 1


def parse_class_edges(text: str) -> tuple[int, int]:
    """``metrics.class_edges`` as (short below, long above) prompt tokens."""
    short, long = (int(part) for part in text.split(","))
    return short, long


def class_edges_valid(text: str) -> bool:
    try:
        short, long = parse_class_edges(text)
    except ValueError:
        return False
    return 0 < short <= long


@dataclass(frozen=True)
class GuardedSRPFConfig:
    """Guarded shortest remaining prefill first, the default: a request is overdue once
    the engine has served ``slack`` times the prefill work FCFS would have served before
    it (or the largest backlog of the last ``window_s`` seconds) plus ``size_allowance``
    times its own prefill work; overdue requests outrank the rest (docs/policies.md,
    "Choosing the default")."""

    slack: float = setting(
        1.15, "a finite number > 0 (a request is overdue once slack times the prefill work "
        "queued ahead of it, or the window's largest backlog, has been served)", positive)
    window_s: float = setting(
        0.0, "a finite number >= 0 (seconds over which the largest backlog is remembered)",
        non_negative)
    size_allowance: float = setting(
        1.0, "a finite number >= 0 (a request may also be passed by this many times its own "
        "prefill work before it is overdue)", non_negative)
    persist_s: float = setting(
        0.0, "a finite number >= 0 (slack beyond 1 applies only to the backlog that persisted "
        "through the last persist_s seconds; 0: to the whole backlog)", non_negative)
    tail_window: int = setting(
        200, "0 (off) or an integer >= 8: requests over which the guard compares its TTFT "
        "and TPOT tails with FCFS's estimates and steps back towards arrival order while "
        "either is longer", lambda v: v == 0 or v >= 8,
        see="docs/policies.md#the-guard-watches-its-own-tail")
    overtake_running: bool = setting(
        False, "true or false (a waiting request that ranks first may take budget from a "
        "prefill already running; false: running prefills keep the budget vLLM's loop "
        "gives them, and the order decides which waiting request starts next)",
        see="docs/policies.md#a-running-prefill-keeps-its-budget")


@dataclass(frozen=True)
class GuardedAgingConfig:
    """Aging (alpha ``auto_factor`` times the measured prefill throughput) inside the
    guard of guarded-srpf, with its own ``slack`` and ``window_s``."""

    slack: float = setting(1.25, "a finite number > 0 (as guarded_srpf.slack)", positive)
    window_s: float = setting(0.0, "a finite number >= 0 (as guarded_srpf.window_s)",
                              non_negative)
    size_allowance: float = setting(
        0.0, "a finite number >= 0 (as guarded_srpf.size_allowance)", non_negative)
    persist_s: float = setting(0.0, "a finite number >= 0 (as guarded_srpf.persist_s)",
                               non_negative)
    auto_factor: float = setting(
        0.25, "a finite number > 0: alpha = auto_factor * prefill tokens/s, as "
        "aging.auto_factor", positive)


@dataclass(frozen=True)
class AgingConfig:
    """Aging's parameters (the Aging key of the chunked-prefill scheduling paper)."""

    alpha: float | str = setting(
        AUTO, 'a finite number > 0 (tokens of priority gained per second of waiting) or "auto" '
        "(auto_factor times the measured prefill throughput)",
        lambda v: v == AUTO or positive(v), allow_auto=True)
    beta: float = setting(-1.0, "a finite number < 0 (priority per remaining prefill token)",
                          lambda v: finite(v) and v < 0)
    auto_factor: float = setting(
        0.25, 'a finite number > 0: alpha = auto_factor * prefill tokens/s when alpha is '
        '"auto"', positive)


@dataclass(frozen=True)
class PreflowConfig:
    """PREFLOW: a request's priority doubles every ``age_doubling_s`` seconds it waits."""

    age_doubling_s: float = setting(
        1.0, "a finite number > 0 (seconds of waiting that double a request's priority)",
        positive)


@dataclass(frozen=True)
class AgingSPFConfig:
    """Aging shortest-prompt-first: ``rate`` prompt tokens of priority per second waited."""

    rate: float = setting(100.0, "a finite number > 0 (prompt tokens per second waited)",
                          positive)


@dataclass(frozen=True)
class ESTFConfig:
    """Estimated shortest tokens first: the estimate before ``min_samples`` completions."""

    prior_output_tokens: float = setting(
        128.0, "a finite number > 0 (estimated output tokens before enough completions)",
        positive)
    min_samples: int = setting(
        5, "an integer >= 1 (completions before an average is used)", at_least_one)


@dataclass(frozen=True)
class AFLCBConfig:
    """Adaptive fair LCB (formula in docs/policies.md)."""

    z: float = setting(1.0, "a finite number >= 0 (standard errors below the mean)",
                       non_negative)
    prompt_weight: float = setting(
        0.1, "a finite number >= 0 (work per remaining prompt token, in output tokens)",
        non_negative)
    age_rate: float = setting(
        50.0, "a finite number > 0 (tokens of work forgiven per second waited)", positive)
    tier_weight: float = setting(
        256.0, "a finite number >= 0 (tokens of work forgiven to a tier owed its whole "
        "share)", non_negative)
    tier_half_life_s: float = setting(
        10.0, "a finite number > 0 (half-life of the per-tier service counters)", positive)
    kv_threshold: float = setting(0.8, "a number in [0, 1) (KV usage where pressure starts)",
                                  lambda v: 0 <= v < 1)
    kv_weight: float = setting(
        1.0, "a finite number >= 0 (penalty per token of KV footprint at full pressure)",
        non_negative)


@dataclass(frozen=True)
class ProfileConfig:
    """Per-step profiling for the latency predictor: off while ``path`` is empty."""

    path: str = setting("", "a file path for the per-step predictor profile, CSV (empty: "
                            "no profiling)")
    memory: str = one_of("auto", MEMORY_PROVIDERS)


@dataclass(frozen=True)
class PredictorConfig:
    """The ONNX latency model and how ONNX Runtime runs it; without ``path``, the built-in
    latency model's served model and accelerator."""

    path: str = setting("", "the path of an ONNX latency model (empty: none)",
                        see="docs/predictor.md")
    provider: str = one_of("cpu", PREDICTOR_PROVIDERS)
    device_id: int = setting(0, "an integer >= 0 (CUDA or NPU device index)",
                             lambda v: v >= 0)
    precision_mode: str = one_of("must_keep_origin_dtype", CANN_PRECISION_MODES,
                                 see="docs/ascend.md")
    """CANN provider only: the graph's precision (CANN's own default, fp16, overflows)."""
    threads: int = setting(1, "an integer >= 1 (ONNX Runtime intra-op threads)",
                           at_least_one)
    allow_memory_mismatch: bool = setting(
        False, "true or false (serve a model profiled with another memory provider)")
    model: str = setting(
        "auto", '"auto" (vLLM\'s model config) or a model preset or config.json path: the '
        "served model the built-in latency model assumes when predictor.path is empty",
        see="docs/predictor.md")
    device: str = setting(
        "auto", '"auto" (the detected accelerator) or an accelerator preset with optional '
        ":field=value overrides (h100:bandwidth_efficiency=0.63): where the built-in "
        "latency model starts when predictor.path is empty", see="docs/predictor.md")


@dataclass(frozen=True)
class LPRSConfig:
    """Latency-predictive chunk selection (the chunked-prefill scheduling paper, section
    3.2.2): per prefill candidate, the chunk whose predicted batch time is closest to
    ``target_ms`` (asymmetric penalties). ``guard_*``: when to stop trusting a predictor
    that does not fit the engine (``policies.lprs_guard``)."""

    enabled: bool | str = setting(
        AUTO, '"auto" (on with predictor.path\'s fitted model unless the policy is fcfs, the '
        "control), true or false (choose prefill chunks by predicted latency; with "
        "predictor.path's model, else the built-in one)", allow_auto=True)
    target_ms: float | str = setting(
        AUTO, 'a finite number > 0 (target batch time, ms) or "auto" (the predicted time of '
        "a step prefilling 4096 tokens, or the token budget when smaller, and nothing "
        "else)", lambda v: v == AUTO or positive(v), allow_auto=True, see="docs/lprs.md")
    granularity: int = setting(32, "an integer >= 1 (chunk search step, tokens)",
                               at_least_one)
    underfill_penalty: float = setting(
        1.0, "a finite number > 0 (score per ms under target)", positive)
    overflow_penalty: float = setting(
        4.0, "a finite number > 0 (score per ms over target; larger than underfill_penalty)",
        positive)
    align: str = setting(
        "auto", '"auto" (align chunk ends to the KV block size on Ascend NPUs), "on" or '
        '"off"', lambda v: v in ALIGN_MODES, normalise=str.lower)
    correction: float = setting(
        0.1, "a number in [0, 1]: weight of each step's measured-minus-predicted time in "
        "the running bias added to predictions (0: the paper's uncorrected predictor)",
        lambda v: 0 <= v <= 1, see="docs/lprs.md")
    guard_window: int = setting(
        16, "an integer >= 0: dispatched batches the guard judges the predictor on (0: no "
        "guard)", lambda v: v >= 0, see="docs/lprs.md#a-predictor-that-does-not-fit-the-engine")
    guard_max_error: float = setting(
        1.0, "a finite number > 0: LPRS falls back to the token budget while the median "
        "|measured - predicted| / measured over the window is above this", positive)
    guard_recover_error: float = setting(
        0.5, "a finite number > 0, at most guard_max_error: LPRS resumes once the median "
        "relative error over the window is at most this", positive)
    guard_min_fill: float = setting(
        0.5, "a number in [0, 1]: LPRS also falls back when it cut chunks in most steps of "
        "the window while their median time was below this x target_ms (0: never)",
        lambda v: 0 <= v <= 1)


@dataclass(frozen=True)
class APCConfig:
    """Active prefill control (the chunked-prefill scheduling paper, section 3.3): a
    dynamic cap on active prefills, a minimum useful chunk, warm start, and a bound on how
    long one prefill can be held back."""

    enabled: bool | str = setting(
        AUTO, '"auto" (on with predictor.path\'s fitted model unless the policy is fcfs, the '
        "control), true or false (active prefill control)", allow_auto=True)
    max_active_prefills: int = setting(
        8, "an integer >= 1 (C_max: prefills a step leaves unfinished, at most)",
        at_least_one)
    min_chunk: int = setting(
        16, "an integer >= 1 (L_min: the minimum useful chunk, tokens)", at_least_one)
    max_deferred_steps: int = setting(
        64, "an integer >= 1 (steps APC may hold one prefill back before it must progress)",
        at_least_one)


@dataclass(frozen=True)
class MetricsConfig:
    """The ``fairsched:`` series on vLLM's ``/metrics`` and the ``GET /fairsched`` view.

    The engine core writes its counters to a snapshot file at most every ``interval_s``
    (and when it falls idle), so the per-step work is counting only (``metrics.snapshot``
    says why a file). Requests are classed by prompt tokens at ``class_edges``."""

    enabled: bool = setting(
        True, "true or false (fairsched: series on vLLM's /metrics, by request class and "
        "tier)", see="docs/observability.md")
    dir: str = setting(
        "", "a folder for the engines' metrics snapshots (empty: fairsched-metrics in the "
        "system's temporary folder)")
    interval_s: float = setting(
        1.0, "a finite number > 0 (seconds between an engine's metrics snapshots, at most)",
        positive)
    class_edges: str = setting(
        "128,1024", 'two increasing prompt-token counts, "SHORT_BELOW,LONG_ABOVE" (short '
        "below the first, long above the second)", class_edges_valid)
    live_view: bool = setting(
        False, "true or false (serve GET /fairsched with the live queue; it describes the "
        "traffic, and vLLM loads it only when VLLM_PLUGINS names fairsched)",
        see="docs/observability.md")


@dataclass(frozen=True)
class FairschedConfig:
    """The whole ``fairsched`` section: the top-level keys and one field per section.
    ``policy``'s accepted names are the policy registry's, which ``config`` fills in."""

    policy: str = setting("guarded-srpf", "a registered policy", normalise=str.lower,
                          see="docs/policies.md")
    service: str = setting(
        "budget", '"budget" (vLLM\'s token budget decides how many requests run) or "ranked" '
        "(each step serves at most max_batch_size requests in policy order)",
        lambda v: v in SERVICE_MODES, normalise=str.lower)
    max_batch_size: int = setting(
        16, "an integer >= 1 (requests served per step when ranked)", at_least_one)
    decodes_first: bool = setting(
        False, "true or false (the chunked-prefill scheduling paper's service: every step "
        "serves the running decodes before any partial prefill, and orders partial "
        "prefills by the policy; false keeps vLLM's running order and only caps prefills)")
    decode_share: float = setting(
        0.0, "a number >= 0 and < 1 (while prefill work waits, decodes get at most this "
        "share of the token budget and the newest are held back; 0: off, vLLM's own "
        "service)", lambda v: 0 <= v < 1,
        see="docs/policies.md#holding-back-decodes-decode_share")
    decode_share_max_tpot_ms: float = setting(
        0.0, "a number >= 0 (with decode_share: a decode is no longer held once its time "
        "per output token since its first decode step reaches this many milliseconds; 0: "
        "no bound, the newest are held for as long as prefill work waits)",
        lambda v: v >= 0, see="docs/policies.md#a-tpot-bound-on-the-hold")
    prefix_aware: bool = setting(
        True, "true or false (a waiting request's remaining prefill is its part not in "
        "vLLM's prefix cache, looked up when it enters the queue; false counts the whole "
        "prompt)")
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
    trace_path: str = setting("", "a file path for the per-step JSON Lines trace (empty: no "
                                  "trace)")
