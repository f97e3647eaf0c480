"""The plugin's one validated configuration.

Sources, later ones overriding earlier ones key by key:

1. defaults;
2. ``FAIRSCHED_CONFIG``: a JSON object, inline or as a path to a ``.json`` file;
3. one environment variable per key, ``FAIRSCHED_`` + the dotted key in upper case with
   dots as underscores (``aging.alpha`` -> ``FAIRSCHED_AGING_ALPHA``);
4. ``--additional-config '{"fairsched": {...}}'``: the launch's own command line wins.

Every key is checked: an unknown key, a wrong type or an out-of-range value raises
:class:`ConfigError` naming the key, where it came from and what is accepted (with the
closest accepted names for a misspelt one), so a typo stops start-up instead of silently
running the default. Fairsched's keys placed beside the ``fairsched`` object rather than
in it cannot be refused the same way (vLLM's other components read their own keys there),
so start-up warns about them (:func:`misplaced_keys`). Values given in code (tests,
benchmarks, tools) go through :func:`from_values`, the same checks. This is the one place
values are checked: the policies and the plan take them as validated.

The sections' classes are in ``settings``, below the policies that take them; this module
sits above the policy registry (the ``policy`` key accepts its names) and re-exports them.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
import typing
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from .policies.registry import POLICIES

# Every section class is re-exported: callers take the whole configuration from here.
from .predictor.roofline import parse_device
from .predictor.hardware import MODEL_ALIASES, MODEL_CONFIGS, PresetError
from .settings import (
    AUTO,
    AFLCBConfig,
    AgingConfig,
    AgingSPFConfig,
    APCConfig,
    ESTFConfig,
    FairschedConfig,
    GuardedAgingConfig,
    GuardedSRPFConfig,
    LPRSConfig,
    MetricsConfig,
    PredictorConfig,
    PreflowConfig,
    ProfileConfig,
)

ENV_PREFIX = "FAIRSCHED_"
CONFIG_ENV = "FAIRSCHED_CONFIG"
STRICT_VLLM_ENV = "FAIRSCHED_STRICT_VLLM"
POLICY_ENV = "FAIRSCHED_POLICY"
"""Set, it switches fairsched on where no other scheduler class is named (``plugin``)."""
"""Not a config key: read at import by ``adapter.compat`` (1 refuses a vLLM newer than the
tested range), before any configuration is loaded."""
ADDITIONAL_CONFIG_KEY = "fairsched"
SERVICE_MODES = ("budget", "ranked")
MEMORY_PROVIDERS = ("auto", "torch", "nvml", "kv_cache")
PREDICTOR_PROVIDERS = ("cpu", "cuda", "cann")
CANN_PRECISION_MODES = ("must_keep_origin_dtype", "force_fp32", "force_fp16",
                        "allow_fp32_to_fp16", "allow_mix_precision")
"""The CANN execution provider's precision modes (ONNX Runtime 1.24); the first keeps the
MLP in fp32, which its unnormalised interaction features need."""
ALIGN_MODES = ("auto", "on", "off")
KEY_LIST = "docs/configuration.md and from fairsched check-config --list-keys"
"""Where every accepted key and variable is listed, for a name with no close match."""

# A child of "vllm": the warning appears in vLLM's own log stream and format.
logger = logging.getLogger("vllm.fairsched")


class ConfigError(ValueError):
    """A configuration value the plugin cannot run with."""


@dataclass(frozen=True)
class _Key:
    path: str
    kind: type
    accepted: str
    """What the key accepts, for messages and the docs."""
    check: Callable[[Any], bool] = lambda _value: True
    normalise: Callable[[Any], Any] = lambda value: value
    allow_auto: bool = False
    choices: tuple[str, ...] = ()
    """The accepted names of a key that takes one of a few, to suggest the closest."""
    see: str = ""
    """A docs page (relative to the repository root) the README's table links to."""

    @property
    def env_name(self) -> str:
        return ENV_PREFIX + self.path.replace(".", "_").upper()


def _finite(value: float) -> bool:
    return math.isfinite(value)


def _positive(value: float) -> bool:
    return _finite(value) and value > 0


def _non_negative(value: float) -> bool:
    return _finite(value) and value >= 0


def _one_of(names: tuple[str, ...]) -> dict[str, Any]:
    """A :class:`_Key`'s ``accepted``, ``check`` and ``choices`` for one name of ``names``."""
    return {"accepted": "one of " + ", ".join(names), "check": lambda v: v in names,
            "choices": names}


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


def policy_names() -> tuple[str, ...]:
    """The registered policies' names (``policies.registry.POLICIES``)."""
    return tuple(POLICIES)


KEYS: tuple[_Key, ...] = (
    _Key("policy", str, **_one_of(policy_names()), normalise=str.lower,
         see="docs/policies.md"),
    _Key(
        "service",
        str,
        '"budget" (vLLM\'s token budget decides how many requests run) or "ranked" '
        "(each step serves at most max_batch_size requests in policy order)",
        lambda v: v in SERVICE_MODES,
        normalise=str.lower,
    ),
    _Key("max_batch_size", int, "an integer >= 1 (requests served per step when ranked)",
         lambda v: v >= 1),
    _Key("decodes_first", bool,
         "true or false (seed 000's service: every step serves the running decodes before "
         "any partial prefill, and orders partial prefills by the policy; false keeps "
         "vLLM's running order and only caps prefills)"),
    _Key("decode_share", float,
         "a number >= 0 and < 1 (while prefill work waits, decodes get at most this share "
         "of the token budget and the newest are held back; 0: off, vLLM's own service)",
         lambda v: 0 <= v < 1, see="docs/policies.md#holding-back-decodes-decode_share"),
    _Key("decode_share_max_tpot_ms", float,
         "a number >= 0 (with decode_share: a decode is no longer held once its time per "
         "output token since its first decode step reaches this many milliseconds; 0: no "
         "bound, the newest are held for as long as prefill work waits)",
         lambda v: v >= 0, see="docs/policies.md#a-tpot-bound-on-the-hold"),
    _Key("prefix_aware", bool,
         "true or false (a waiting request's remaining prefill is its part not in vLLM's "
         "prefix cache, looked up when it enters the queue; false counts the whole prompt)"),
    _Key("guarded_srpf.slack", float,
         "a finite number > 0 (a request is overdue once slack times the prefill work "
         "queued ahead of it, or the window's largest backlog, has been served)", _positive),
    _Key("guarded_srpf.window_s", float,
         "a finite number >= 0 (seconds over which the largest backlog is remembered)",
         _non_negative),
    _Key("guarded_srpf.size_allowance", float,
         "a finite number >= 0 (a request may also be passed by this many times its own "
         "prefill work before it is overdue)", _non_negative),
    _Key("guarded_srpf.persist_s", float,
         "a finite number >= 0 (slack beyond 1 applies only to the backlog that persisted "
         "through the last persist_s seconds; 0: to the whole backlog)", _non_negative),
    _Key("guarded_srpf.tail_window", int,
         "0 (off) or an integer >= 8: requests over which the guard compares its TTFT "
         "and TPOT tails with FCFS's estimates and steps back towards arrival order while "
         "either is longer",
         lambda v: v == 0 or v >= 8, see="docs/policies.md#the-guard-watches-its-own-tail"),
    _Key("guarded_srpf.overtake_running", bool,
         "true or false (a waiting request that ranks first may take budget from a prefill "
         "already running; false: running prefills keep the budget vLLM's loop gives them, "
         "and the order decides which waiting request starts next)",
         see="docs/policies.md#a-running-prefill-keeps-its-budget"),
    _Key("guarded_aging.slack", float, "a finite number > 0 (as guarded_srpf.slack)",
         _positive),
    _Key("guarded_aging.window_s", float, "a finite number >= 0 (as guarded_srpf.window_s)",
         _non_negative),
    _Key("guarded_aging.size_allowance", float,
         "a finite number >= 0 (as guarded_srpf.size_allowance)", _non_negative),
    _Key("guarded_aging.persist_s", float, "a finite number >= 0 (as guarded_srpf.persist_s)",
         _non_negative),
    _Key("guarded_aging.auto_factor", float,
         "a finite number > 0: alpha = auto_factor * prefill tokens/s, as aging.auto_factor",
         _positive),
    _Key(
        "aging.alpha",
        float,
        'a finite number > 0 (tokens of priority gained per second of waiting) or "auto" '
        "(auto_factor times the measured prefill throughput)",
        lambda v: v == AUTO or (_finite(v) and v > 0),
        allow_auto=True,
    ),
    _Key(
        "aging.beta",
        float,
        "a finite number < 0 (priority per remaining prefill token)",
        lambda v: _finite(v) and v < 0,
    ),
    _Key(
        "aging.auto_factor",
        float,
        'a finite number > 0: alpha = auto_factor * prefill tokens/s when alpha is "auto"',
        lambda v: _finite(v) and v > 0,
    ),
    _Key("preflow.age_doubling_s", float,
         "a finite number > 0 (seconds of waiting that double a request's priority)",
         _positive),
    _Key("aging_spf.rate", float, "a finite number > 0 (prompt tokens per second waited)",
         _positive),
    _Key("estf.prior_output_tokens", float,
         "a finite number > 0 (estimated output tokens before enough completions)", _positive),
    _Key("estf.min_samples", int, "an integer >= 1 (completions before an average is used)",
         lambda v: v >= 1),
    _Key("af_lcb.z", float, "a finite number >= 0 (standard errors below the mean)",
         _non_negative),
    _Key("af_lcb.prompt_weight", float,
         "a finite number >= 0 (work per remaining prompt token, in output tokens)",
         _non_negative),
    _Key("af_lcb.age_rate", float, "a finite number > 0 (tokens of work forgiven per second "
         "waited)", _positive),
    _Key("af_lcb.tier_weight", float,
         "a finite number >= 0 (tokens of work forgiven to a tier owed its whole share)", _non_negative),
    _Key("af_lcb.tier_half_life_s", float,
         "a finite number > 0 (half-life of the per-tier service counters)", _positive),
    _Key("af_lcb.kv_threshold", float, "a number in [0, 1) (KV usage where pressure starts)",
         lambda v: 0 <= v < 1),
    _Key("af_lcb.kv_weight", float,
         "a finite number >= 0 (penalty per token of KV footprint at full pressure)",
         _non_negative),
    _Key("profile.path", str,
         "a file path for the per-step predictor profile, CSV (empty: no profiling)"),
    _Key("profile.memory", str, **_one_of(MEMORY_PROVIDERS), normalise=str.lower),
    _Key("predictor.path", str, "the path of an ONNX latency model (empty: none)",
         see="docs/predictor.md"),
    _Key("predictor.provider", str, **_one_of(PREDICTOR_PROVIDERS), normalise=str.lower),
    _Key("predictor.device_id", int, "an integer >= 0 (CUDA or NPU device index)",
         lambda v: v >= 0),
    _Key("predictor.precision_mode", str, **_one_of(CANN_PRECISION_MODES),
         normalise=str.lower, see="docs/ascend.md"),
    _Key("predictor.threads", int, "an integer >= 1 (ONNX Runtime intra-op threads)",
         lambda v: v >= 1),
    _Key("predictor.allow_memory_mismatch", bool,
         "true or false (serve a model profiled with another memory provider)"),
    _Key("predictor.model", str,
         '"auto" (vLLM\'s model config) or a model preset or config.json path: the served '
         "model the built-in latency model assumes when predictor.path is empty",
         see="docs/predictor.md"),
    _Key("predictor.device", str,
         '"auto" (the detected accelerator) or an accelerator preset with optional '
         ":field=value overrides (h100:bandwidth_efficiency=0.63): where the built-in "
         "latency model starts when predictor.path is empty", see="docs/predictor.md"),
    _Key("lprs.enabled", bool, '"auto" (on with predictor.path\'s fitted model unless the '
         "policy is fcfs, the control), true or false (choose prefill chunks by predicted "
         "latency; with predictor.path's model, else the built-in one)", allow_auto=True),
    _Key("lprs.target_ms", float,
         'a finite number > 0 (target batch time, ms) or "auto" (the predicted time of a '
         "step prefilling 4096 tokens, or the token budget when smaller, and nothing else)",
         lambda v: v == AUTO or _positive(v), allow_auto=True, see="docs/lprs.md"),
    _Key("lprs.granularity", int, "an integer >= 1 (chunk search step, tokens)",
         lambda v: v >= 1),
    _Key("lprs.underfill_penalty", float, "a finite number > 0 (score per ms under target)",
         _positive),
    _Key("lprs.overflow_penalty", float,
         "a finite number > 0 (score per ms over target; larger than underfill_penalty)",
         _positive),
    _Key("lprs.align", str, '"auto" (align chunk ends to the KV block size on Ascend NPUs), '
         '"on" or "off"', lambda v: v in ALIGN_MODES, normalise=str.lower),
    _Key("lprs.correction", float,
         "a number in [0, 1]: weight of each step's measured-minus-predicted time in the "
         "running bias added to predictions (0: the paper's uncorrected predictor)",
         lambda v: 0 <= v <= 1, see="docs/lprs.md"),
    _Key("lprs.guard_window", int,
         "an integer >= 0: dispatched batches the guard judges the predictor on (0: no "
         "guard)", lambda v: v >= 0,
         see="docs/lprs.md#a-predictor-that-does-not-fit-the-engine"),
    _Key("lprs.guard_max_error", float,
         "a finite number > 0: LPRS falls back to the token budget while the median "
         "|measured - predicted| / measured over the window is above this", _positive),
    _Key("lprs.guard_recover_error", float,
         "a finite number > 0, at most guard_max_error: LPRS resumes once the median "
         "relative error over the window is at most this", _positive),
    _Key("lprs.guard_min_fill", float,
         "a number in [0, 1]: LPRS also falls back when it cut chunks in most steps of the "
         "window while their median time was below this x target_ms (0: never)",
         lambda v: 0 <= v <= 1),
    _Key("apc.enabled", bool, '"auto" (on with predictor.path\'s fitted model unless the '
         "policy is fcfs, the control), true or false (active prefill control)",
         allow_auto=True),
    _Key("apc.max_active_prefills", int,
         "an integer >= 1 (C_max: prefills a step leaves unfinished, at most)",
         lambda v: v >= 1),
    _Key("apc.min_chunk", int, "an integer >= 1 (L_min: the minimum useful chunk, tokens)",
         lambda v: v >= 1),
    _Key("apc.max_deferred_steps", int,
         "an integer >= 1 (steps APC may hold one prefill back before it must progress)",
         lambda v: v >= 1),
    _Key("metrics.enabled", bool,
         "true or false (fairsched: series on vLLM's /metrics, by request class and tier)",
         see="docs/observability.md"),
    _Key("metrics.dir", str,
         "a folder for the engines' metrics snapshots (empty: fairsched-metrics in the "
         "system's temporary folder)"),
    _Key("metrics.interval_s", float,
         "a finite number > 0 (seconds between an engine's metrics snapshots, at most)",
         _positive),
    _Key("metrics.class_edges", str,
         'two increasing prompt-token counts, "SHORT_BELOW,LONG_ABOVE" (short below the '
         "first, long above the second)", class_edges_valid),
    _Key("metrics.live_view", bool,
         "true or false (serve GET /fairsched with the live queue; it describes the "
         "traffic, and vLLM loads it only when VLLM_PLUGINS names fairsched)",
         see="docs/observability.md"),
    _Key(
        "trace_path",
        str,
        "a file path for the per-step JSON Lines trace (empty: no trace)",
    ),
)
_BY_PATH = {key.path: key for key in KEYS}
_BY_ENV = {key.env_name: key for key in KEYS}
_SECTIONS = {key.path.split(".")[0] for key in KEYS if "." in key.path}
_NAMES = {key.path for key in KEYS} | _SECTIONS
"""Every name the ``fairsched`` object accepts: dotted keys and section names."""
_TOP_NAMES = {name for name in _NAMES if "." not in name}
_LEAVES = {name.rsplit(".", 1)[-1] for name in _NAMES}
_VARIABLES = (*_BY_ENV, CONFIG_ENV, STRICT_VLLM_ENV)
_CLOSE = 0.7
"""``difflib`` similarity a name needs to be suggested: at 0.6, its default, a key such
as ``lprs.targt_ms`` also drew unrelated ones from its section (``lprs.align``)."""
_WRAPPER = re.compile(r"fair[-_. ]?sched(?:[-_. ](?P<rest>.*))?", re.IGNORECASE | re.DOTALL)
"""``fairsched`` in another spelling (``Fairsched``, ``fair_sched``), alone or as the
prefix of a key (``fairsched_policy``, ``fairsched.lprs``)."""


def load_config(
    additional_config: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> FairschedConfig:
    """Merge and validate every source (see the module docstring). Fairsched keys beside
    the ``fairsched`` object are logged as a warning and left out, not refused: a
    deployment that started with them must still start after an upgrade."""
    environ = os.environ if environ is None else environ
    misplaced = misplaced_keys(additional_config)
    if misplaced:
        logger.warning(misplaced_message("--additional-config", additional_config or {},
                                         misplaced))
    values: dict[str, Any] = {}
    if CONFIG_ENV in environ:
        values.update(_flatten(_read_json_source(environ[CONFIG_ENV]), CONFIG_ENV))
    values.update(_from_env(environ))
    section = (additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
    if section is not None:
        source = f"--additional-config {ADDITIONAL_CONFIG_KEY!r}"
        if not isinstance(section, Mapping):
            raise ConfigError(f"{source} must be a JSON object, got {section!r}")
        values.update(_flatten(section, source))
    return _build(values)


def misplaced_keys(additional_config: Mapping[str, Any] | None) -> dict[str, str]:
    """The top-level keys of ``additional_config`` that hold fairsched settings outside
    the ``fairsched`` object, each mapped to its name inside that object (``""`` for a
    misspelt ``fairsched`` whose value is the object itself).

    vLLM hands ``--additional-config`` to every component (vLLM-Ascend reads its own keys
    there), so a key the plugin does not know is not an error; but start-up reads only
    ``fairsched``, so a key named like one of its keys or sections (``policy``, ``lprs``,
    ``lprs.target_ms``, ``lprs_target_ms``, in any case) or like the object itself
    (``Fairsched``, ``fairsched_policy``, ``fairsched.policy``) would be ignored without a
    word and the launch would run the defaults. Start-up warns about these keys and
    ``fairsched check-config`` refuses them: both ask this function."""
    out: dict[str, str] = {}
    for name, value in (additional_config or {}).items():
        if not isinstance(name, str) or name == ADDITIONAL_CONFIG_KEY:
            continue
        wrapper = _WRAPPER.fullmatch(name)
        if wrapper:
            rest = wrapper["rest"] or ""
            inner = _own_name(rest)
            if inner is None:
                # ``Fairsched: {...}`` or ``fairsched_config: {...}``: the object itself
                # under another name; an unknown ``fairsched_foo: 1`` keeps ``foo``, which
                # the object's own check then refuses with the closest names.
                inner = "" if not rest or isinstance(value, Mapping) else rest
            out[name] = inner
        elif (inner := _own_name(name)) is not None:
            out[name] = inner
    return out


def _own_name(name: str) -> str | None:
    """``name`` as the ``fairsched`` object spells it, if it is one of its keys or
    sections there (dotted or not, in any case, or in the variables' underscore form)."""
    lower = name.lower()
    if lower.split(".")[0] in _TOP_NAMES:
        return lower
    key = _BY_ENV.get(ENV_PREFIX + lower.replace(".", "_").upper())
    return None if key is None else key.path


def corrected_additional_config(additional_config: Mapping[str, Any],
                                misplaced: Mapping[str, str]) -> dict[str, Any]:
    """``additional_config`` with the ``misplaced`` keys moved into its ``fairsched``
    object, under their names there; a key the object already sets keeps its value
    there, as start-up would have used it."""
    given = additional_config.get(ADDITIONAL_CONFIG_KEY)
    section = dict(given) if isinstance(given, Mapping) else {}
    out = {name: value for name, value in additional_config.items()
           if name not in misplaced and name != ADDITIONAL_CONFIG_KEY}
    for name, inner in misplaced.items():
        value = additional_config[name]
        moved = dict(value) if inner == "" and isinstance(value, Mapping) else {inner: value}
        for key, item in moved.items():
            section.setdefault(key, item)
    out[ADDITIONAL_CONFIG_KEY] = section
    return out


def misplaced_message(origin: str, additional_config: Mapping[str, Any],
                      misplaced: Mapping[str, str]) -> str:
    """What start-up logs, and check-config prints, about the ``misplaced`` keys of
    ``additional_config`` (from ``origin``): each key, and the whole corrected JSON to
    paste in its place."""
    fixed = json.dumps(corrected_additional_config(additional_config, misplaced),
                       default=repr)
    return (f"fairsched: {origin} has fairsched settings outside its "
            f"{ADDITIONAL_CONFIG_KEY!r} object: {', '.join(map(repr, misplaced))}. Start-up "
            f"reads only that object and ignores them; put them under it: {fixed}")


def from_values(section: Mapping[str, Any]) -> FairschedConfig:
    """A config from values given in code (the ``fairsched`` section's shape, nested or
    dotted keys), validated exactly as :func:`load_config` validates a launch's: the one
    way tests, benchmarks and tools build a policy's settings. No defaults are read from
    the environment."""
    return _build(_flatten(section, None))


def accepted_keys() -> str:
    """One line per key: dotted name, environment variable, accepted values."""
    return "\n".join(f"  {k.path} ({k.env_name}): {k.accepted}" for k in KEYS)


def key_value(config: FairschedConfig, path: str) -> Any:
    """The value of the dotted key ``path`` (``guarded_srpf.slack``) in ``config``."""
    value: Any = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


def markdown_table() -> str:
    """The README's configuration table: one row per key of :data:`KEYS` with its
    environment variable, default and accepted values (``scripts/config_table.py`` writes
    it into the README; a test fails when the two differ)."""
    defaults = FairschedConfig()
    rows = ["| key | environment variable | default | accepted |", "|---|---|---|---|"]
    for key in KEYS:
        default = key_value(defaults, key.path)
        accepted = _policy_summaries() if key.path == "policy" else key.accepted
        if key.see:
            accepted += f" ([{key.see.split('#')[0]}]({key.see}))"
        accepted = accepted.replace("|", "\\|")  # a table cell: escape the column bar
        rows.append(f"| `{key.path}` | `{key.env_name}` | {_markdown_value(default)} | "
                    f"{accepted} |")
    rows.append(f"| (all) | `{CONFIG_ENV}` | | a JSON object with the keys above, inline or "
                "as a file path |")
    return "\n".join(rows) + "\n"


def _policy_summaries() -> str:
    return "one of " + ", ".join(f"`{name}` ({entry.summary})"
                                 for name, entry in POLICIES.items())


def _markdown_value(value: Any) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`" if value != "" else "(none)"


def _read_json_source(text: str) -> Mapping[str, Any]:
    raw = text.strip()
    if not raw.startswith("{"):
        path = Path(raw)
        try:
            raw = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"{CONFIG_ENV}: neither a JSON object nor a readable UTF-8 file: {raw!r} ({exc})"
            ) from exc
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{CONFIG_ENV}: not valid JSON ({exc})") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"{CONFIG_ENV}: must hold a JSON object, got {type(data).__name__}")
    return data


def _flatten(section: Mapping[str, Any], source: str | None,
             prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in section.items():
        path = f"{prefix}{name}"
        if isinstance(value, Mapping) and any(k.startswith(path + ".") for k in _BY_PATH):
            out.update(_flatten(value, source, path + "."))
            continue
        key = _BY_PATH.get(path)
        if key is None and any(k.startswith(path + ".") for k in _BY_PATH):
            raise ConfigError(
                f"fairsched config: {path!r}{_in(source)} must be a JSON object")
        if key is None:
            raise ConfigError(f"fairsched config: unknown key {path!r}{_in(source)}; "
                              + _suggestion(map(repr, _close_keys(path))))
        out[path] = _coerce(key, value, source)
    return out


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, text in environ.items():
        if not name.startswith(ENV_PREFIX) or name in (CONFIG_ENV, STRICT_VLLM_ENV):
            continue
        key = _BY_ENV.get(name)
        if key is None:
            raise ConfigError(f"fairsched config: unknown environment variable {name}; "
                              + _suggestion(_close_variables(name)))
        out[key.path] = _coerce(key, text, name)
    return out


def _close_keys(path: str) -> list[str]:
    """The accepted names closest to the unknown dotted key ``path``: by the whole name
    (``lprs.targt_ms``), else by its last part alone, which finds a key nested under the
    wrong section or under none (``targt_ms`` -> ``lprs.target_ms``)."""
    close = difflib.get_close_matches(path, _NAMES, n=3, cutoff=_CLOSE)
    if close:
        return close
    leaves = difflib.get_close_matches(path.rsplit(".", 1)[-1], _LEAVES, n=3, cutoff=_CLOSE)
    return sorted(name for name in _NAMES if name.rsplit(".", 1)[-1] in leaves)[:3]


def _close_variables(name: str) -> list[str]:
    """The accepted ``FAIRSCHED_*`` variables closest to the unknown ``name``, compared
    without the prefix they all share (which would make every one look close)."""
    rest = {variable[len(ENV_PREFIX):]: variable for variable in _VARIABLES}
    close = difflib.get_close_matches(name[len(ENV_PREFIX):], rest, n=3, cutoff=_CLOSE)
    return [rest[match] for match in close]


def _suggestion(close: Iterable[str]) -> str:
    """The end of an unknown name's message: the closest accepted names, or where the
    list of them is. The list itself (57 keys) would bury the one line that matters."""
    names = list(close)
    if names:
        return f"did you mean {' or '.join(names)}?"
    return f"no accepted name is close to it; the list is in {KEY_LIST}"


def _close_choice(key: _Key, value: Any) -> str:
    """For a key that takes one of a few names: the closest to the refused ``value``, at
    difflib's default similarity (one wrong letter of a three-letter name, ``sjf``, is
    below :data:`_CLOSE`)."""
    if not key.choices or not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, key.choices, n=2)
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


def _in(source: str | None) -> str:
    """Where a value came from, for messages (nothing for values given in code)."""
    return "" if source is None else f" in {source}"


def _from(source: str | None) -> str:
    return "" if source is None else f" from {source}"


def _coerce(key: _Key, value: Any, source: str | None) -> Any:
    """Turn a JSON value or an environment string into the key's type, or fail clearly."""
    if key.allow_auto and isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    try:
        if key.kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise TypeError
            result: Any = float(value)
        elif key.kind is int:
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise TypeError
            result = int(value)
        elif key.kind is bool:
            result = _to_bool(value)
        elif key.kind is str:
            if not isinstance(value, str):
                raise TypeError
            result = key.normalise(value.strip())
        else:
            raise AssertionError(f"no coercion for {key.kind}")
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(
            f"fairsched config: {key.path}{_from(source)} must be {key.accepted}; "
            f"got {value!r}"
        ) from None
    if not key.check(result):
        raise ConfigError(
            f"fairsched config: {key.path}{_from(source)} must be {key.accepted}; "
            f"got {value!r}" + _close_choice(key, result)
        )
    return result


def _to_bool(value: Any) -> bool:
    """JSON booleans, or the usual spellings in an environment variable."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


def _build(values: Mapping[str, Any]) -> FairschedConfig:
    config = resolve_auto_switches(_nest(values))
    lprs = config.lprs
    if lprs.overflow_penalty <= lprs.underfill_penalty:
        raise ConfigError(
            "fairsched config: lprs penalties must satisfy underfill < overflow: "
            "lprs.overflow_penalty must be larger than lprs.underfill_penalty "
            f"(overflowing the target is the worse error); got "
            f"{lprs.overflow_penalty:g} <= {lprs.underfill_penalty:g}"
        )
    if lprs.guard_recover_error > lprs.guard_max_error:
        raise ConfigError(
            "fairsched config: lprs.guard_recover_error must be at most "
            f"lprs.guard_max_error (resume only once predictions agree better than the "
            f"fall-back threshold); got {lprs.guard_recover_error:g} > "
            f"{lprs.guard_max_error:g}"
        )
    if config.decode_share > 0 and config.service == "ranked":
        raise ConfigError(
            "fairsched config: decode_share needs service \"budget\": ranked service "
            "already decides which running requests a step serves")
    if config.decode_share_max_tpot_ms > 0 and config.decode_share == 0:
        raise ConfigError(
            "fairsched config: decode_share_max_tpot_ms bounds the decode hold and needs "
            "decode_share > 0 (the share of the budget decodes keep while prefill work "
            "waits)")
    if not config.predictor.path:
        _check_built_in_model(config.predictor)
    return config


def resolve_auto_switches(config: FairschedConfig) -> FairschedConfig:
    """``lprs.enabled`` and ``apc.enabled`` "auto": on with a latency model fitted to the
    engine (``predictor.path``), unless the policy is ``fcfs``, which stays vLLM's own
    schedule (the control arm). The built-in model is not fitted to the engine, and chunks
    sized by it can lower the prefill rate on long prompts: without a fitted model, prefill
    chunks stay vLLM's token-budget rule."""
    on = config.policy != "fcfs" and bool(config.predictor.path)
    if config.lprs.enabled == AUTO:
        config = replace(config, lprs=replace(config.lprs, enabled=on))
    if config.apc.enabled == AUTO:
        config = replace(config, apc=replace(config.apc, enabled=on))
    return config


def _check_built_in_model(predictor: Any) -> None:
    """``predictor.model`` and ``predictor.device`` name presets that exist (a config.json
    path is read when the engine starts)."""
    if predictor.device != "auto":
        try:
            parse_device(predictor.device)
        except PresetError as exc:
            raise ConfigError(f"fairsched config: predictor.device: {exc}") from None
    model = predictor.model
    if (model != "auto" and MODEL_ALIASES.get(model.lower(), model.lower()) not in MODEL_CONFIGS
            and not (model.endswith(".json") or "/" in model)):
        raise ConfigError(
            f"fairsched config: predictor.model {model!r} is neither \"auto\", a preset "
            f"({', '.join(MODEL_CONFIGS)}) nor a config.json path")


def _nest(values: Mapping[str, Any]) -> FairschedConfig:
    nested: dict[str, Any] = {}
    for path, value in values.items():
        *parents, leaf = path.split(".")
        target = nested
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = value
    return _construct(FairschedConfig, nested)


def _construct(cls: type, data: Mapping[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in fields(cls):
        if f.name in data:
            kind = hints[f.name]
            value = data[f.name]
            kwargs[f.name] = _construct(kind, value) if is_dataclass(kind) else value
    return cls(**kwargs)


def uses_fairsched(scheduler_cls: object) -> bool:
    """Whether a launch will run fairsched's scheduler: named on the command line, or
    switched on by the environment with no other class named."""
    if scheduler_cls is None:
        return POLICY_ENV in os.environ
    name = scheduler_cls if isinstance(scheduler_cls, str) else (
        f"{getattr(scheduler_cls, '__module__', '')}.{getattr(scheduler_cls, '__qualname__', '')}")
    return name.startswith("fairsched_plugin.")
