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

Every setting is declared once, as a field of its section in ``settings`` (type, default,
accepted values, check, docs link); :class:`Schema` derives the dotted keys, the
environment variables, ``check-config --list-keys`` and the docs' table from those fields.
This module sits above the policy registry (the ``policy`` key accepts its names) and
re-exports the sections' classes.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
import typing
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from .policies.registry import POLICIES
from .predictor.hardware import MODEL_ALIASES, MODEL_CONFIGS, PresetError
from .predictor.roofline import parse_device
from .user_files import json_object

# Every section class is re-exported: callers take the whole configuration from here.
from .settings import (
    ALIGN_MODES,
    AUTO,
    CANN_PRECISION_MODES,
    MEMORY_PROVIDERS,
    PREDICTOR_PROVIDERS,
    SERVICE_MODES,
    SETTING,
    choice_of,
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
    Setting,
    parse_class_edges,
)

ENV_PREFIX = "FAIRSCHED_"
CONFIG_ENV = "FAIRSCHED_CONFIG"
STRICT_VLLM_ENV = "FAIRSCHED_STRICT_VLLM"
"""Not a config key: read at import by ``adapter.compat`` (1 refuses a vLLM newer than the
tested range), before any configuration is loaded."""
POLICY_ENV = "FAIRSCHED_POLICY"
"""Set, it switches fairsched on where no other scheduler class is named (``plugin``)."""
ADDITIONAL_CONFIG_KEY = "fairsched"
KEY_LIST = "docs/configuration.md and from fairsched check-config --list-keys"
"""Where every accepted key and variable is listed, for a name with no close match."""

# A child of "vllm": the warning appears in vLLM's own log stream and format.
logger = logging.getLogger("vllm.fairsched")


class ConfigError(ValueError):
    """A configuration value the plugin cannot run with."""


@dataclass(frozen=True)
class Key:
    """One dotted key: a setting of ``settings`` at its place in the ``fairsched`` object."""

    path: str
    kind: type
    """The value's type; a setting that also takes "auto" has it in ``setting``."""
    setting: Setting

    @property
    def env_name(self) -> str:
        return ENV_PREFIX + self.path.replace(".", "_").upper()

    @property
    def accepted(self) -> str:
        return self.setting.accepted

    @property
    def see(self) -> str:
        return self.setting.see


def keys_of(section: type, names: Mapping[str, tuple[str, ...]], prefix: str = ""
            ) -> tuple[Key, ...]:
    """Every setting of ``section`` and of the sections in it, in field order, as dotted
    keys. ``names``: for a key whose accepted names only a layer above ``settings`` knows
    (``policy``: the registry's), those names."""
    hints = typing.get_type_hints(section)
    keys: list[Key] = []
    for f in fields(section):
        path, hint = prefix + f.name, hints[f.name]
        if is_dataclass(hint):
            keys.extend(keys_of(hint, names, path + "."))
            continue
        declared = f.metadata.get(SETTING)
        if declared is None:
            raise TypeError(f"{section.__name__}.{f.name}: declare it with settings.setting, "
                            "or give it a section class")
        if path in names:
            declared = replace(declared, **choice_of(names[path]))
        keys.append(Key(path, _value_type(hint), declared))
    return tuple(keys)


def _value_type(hint: Any) -> type:
    """The type a field's values are read as: ``float | str`` (a number or "auto") is a
    float."""
    members = [member for member in typing.get_args(hint) if member is not str]
    return members[0] if members else hint


def policy_names() -> tuple[str, ...]:
    """The registered policies' names (``policies.registry.POLICIES``)."""
    return tuple(POLICIES)


_CLOSE = 0.7
"""``difflib`` similarity a name needs to be suggested: at 0.6, its default, a key such
as ``lprs.targt_ms`` also drew unrelated ones from its section (``lprs.align``)."""
_WRAPPER = re.compile(r"fair[-_. ]?sched(?:[-_. ](?P<rest>.*))?", re.IGNORECASE | re.DOTALL)
"""``fairsched`` in another spelling (``Fairsched``, ``fair_sched``), alone or as the
prefix of a key (``fairsched_policy``, ``fairsched.lprs``)."""


class Schema:
    """The keys of a configuration class and everything read through them: loading from
    every source, the checks, the closest names for a misspelt one, the key list and the
    docs' table. :data:`SCHEMA` is the plugin's; a subclass of :class:`FairschedConfig`
    with one more field gets its own, with nothing else to change."""

    def __init__(self, root: type[FairschedConfig]) -> None:
        self.root = root
        self.keys = keys_of(root, {"policy": policy_names()})
        self.by_path = {key.path: key for key in self.keys}
        self.by_env = {key.env_name: key for key in self.keys}
        sections = {key.path.split(".")[0] for key in self.keys if "." in key.path}
        self.names = {key.path for key in self.keys} | sections
        """Every name the ``fairsched`` object accepts: dotted keys and section names."""
        self.top_names = {name for name in self.names if "." not in name}
        self.leaves = {name.rsplit(".", 1)[-1] for name in self.names}
        self.variables = (*self.by_env, CONFIG_ENV, STRICT_VLLM_ENV)

    def load(
        self,
        additional_config: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> FairschedConfig:
        """Merge and validate every source (see the module docstring). Fairsched keys beside
        the ``fairsched`` object are logged as a warning and left out, not refused: a
        deployment that started with them must still start after an upgrade."""
        environ = os.environ if environ is None else environ
        misplaced = self.misplaced_keys(additional_config)
        if misplaced:
            logger.warning(misplaced_message("--additional-config", additional_config or {},
                                             misplaced))
        values: dict[str, Any] = {}
        if CONFIG_ENV in environ:
            values.update(self._flatten(_read_json_source(environ[CONFIG_ENV]), CONFIG_ENV))
        values.update(self._from_env(environ))
        section = (additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        if section is not None:
            source = f"--additional-config {ADDITIONAL_CONFIG_KEY!r}"
            if not isinstance(section, Mapping):
                raise ConfigError(f"{source} must be a JSON object, got {section!r}")
            values.update(self._flatten(section, source))
        return self._build(values)

    def misplaced_keys(self, additional_config: Mapping[str, Any] | None) -> dict[str, str]:
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
                inner = self._own_name(rest)
                if inner is None:
                    # ``Fairsched: {...}`` or ``fairsched_config: {...}``: the object itself
                    # under another name; an unknown ``fairsched_foo: 1`` keeps ``foo``, which
                    # the object's own check then refuses with the closest names.
                    inner = "" if not rest or isinstance(value, Mapping) else rest
                out[name] = inner
            elif (inner := self._own_name(name)) is not None:
                out[name] = inner
        return out

    def _own_name(self, name: str) -> str | None:
        """``name`` as the ``fairsched`` object spells it, if it is one of its keys or
        sections there (dotted or not, in any case, or in the variables' underscore form)."""
        lower = name.lower()
        if lower.split(".")[0] in self.top_names:
            return lower
        key = self.by_env.get(ENV_PREFIX + lower.replace(".", "_").upper())
        return None if key is None else key.path

    def from_values(self, section: Mapping[str, Any]) -> FairschedConfig:
        """A config from values given in code (the ``fairsched`` section's shape, nested or
        dotted keys), validated exactly as :meth:`load` validates a launch's: the one
        way tests, benchmarks and tools build a policy's settings. No defaults are read from
        the environment."""
        return self._build(self._flatten(section, None))

    def accepted_keys(self) -> str:
        """One line per key: dotted name, environment variable, accepted values."""
        return "\n".join(f"  {k.path} ({k.env_name}): {k.accepted}" for k in self.keys)

    def markdown_table(self) -> str:
        """The configuration page's table: one row per key with its environment variable,
        default and accepted values (``scripts/config_table.py`` writes it into
        docs/configuration.md; a test fails when the two differ)."""
        defaults = self.root()
        rows = ["| key | environment variable | default | accepted |", "|---|---|---|---|"]
        for key in self.keys:
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

    def _flatten(self, section: Mapping[str, Any], source: str | None,
                 prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in section.items():
            path = f"{prefix}{name}"
            if isinstance(value, Mapping) and any(k.startswith(path + ".") for k in self.by_path):
                out.update(self._flatten(value, source, path + "."))
                continue
            key = self.by_path.get(path)
            if key is None and any(k.startswith(path + ".") for k in self.by_path):
                raise ConfigError(
                    f"fairsched config: {path!r}{_in(source)} must be a JSON object")
            if key is None:
                raise ConfigError(f"fairsched config: unknown key {path!r}{_in(source)}; "
                                  + _suggestion(map(repr, self._close_keys(path))))
            out[path] = _coerce(key, value, source)
        return out

    def _from_env(self, environ: Mapping[str, str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, text in environ.items():
            if not name.startswith(ENV_PREFIX) or name in (CONFIG_ENV, STRICT_VLLM_ENV):
                continue
            key = self.by_env.get(name)
            if key is None:
                raise ConfigError(f"fairsched config: unknown environment variable {name}; "
                                  + _suggestion(self._close_variables(name)))
            out[key.path] = _coerce(key, text, name)
        return out

    def _close_keys(self, path: str) -> list[str]:
        """The accepted names closest to the unknown dotted key ``path``: by the whole name
        (``lprs.targt_ms``), else by its last part alone, which finds a key nested under the
        wrong section or under none (``targt_ms`` -> ``lprs.target_ms``)."""
        close = difflib.get_close_matches(path, self.names, n=3, cutoff=_CLOSE)
        if close:
            return close
        leaves = difflib.get_close_matches(path.rsplit(".", 1)[-1], self.leaves, n=3, cutoff=_CLOSE)
        return sorted(name for name in self.names if name.rsplit(".", 1)[-1] in leaves)[:3]

    def _close_variables(self, name: str) -> list[str]:
        """The accepted ``FAIRSCHED_*`` variables closest to the unknown ``name``, compared
        without the prefix they all share (which would make every one look close)."""
        rest = {variable[len(ENV_PREFIX):]: variable for variable in self.variables}
        close = difflib.get_close_matches(name[len(ENV_PREFIX):], rest, n=3, cutoff=_CLOSE)
        return [rest[match] for match in close]

    def _build(self, values: Mapping[str, Any]) -> FairschedConfig:
        config = resolve_auto_switches(self._nest(values))
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

    def _nest(self, values: Mapping[str, Any]) -> FairschedConfig:
        nested: dict[str, Any] = {}
        for path, value in values.items():
            *parents, leaf = path.split(".")
            target = nested
            for parent in parents:
                target = target.setdefault(parent, {})
            target[leaf] = value
        return _construct(self.root, nested)


SCHEMA = Schema(FairschedConfig)
KEYS = SCHEMA.keys
"""The plugin's keys, in the order of ``settings``' fields."""


def load_config(additional_config: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> FairschedConfig:
    """The launch's configuration from every source (:meth:`Schema.load`)."""
    return SCHEMA.load(additional_config, environ)


def from_values(section: Mapping[str, Any]) -> FairschedConfig:
    """A configuration from values given in code (:meth:`Schema.from_values`)."""
    return SCHEMA.from_values(section)


def misplaced_keys(additional_config: Mapping[str, Any] | None) -> dict[str, str]:
    """:meth:`Schema.misplaced_keys` of the plugin's keys."""
    return SCHEMA.misplaced_keys(additional_config)


def accepted_keys() -> str:
    """:meth:`Schema.accepted_keys` of the plugin's keys."""
    return SCHEMA.accepted_keys()


def markdown_table() -> str:
    """:meth:`Schema.markdown_table` of the plugin's keys."""
    return SCHEMA.markdown_table()


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


def key_value(config: FairschedConfig, path: str) -> Any:
    """The value of the dotted key ``path`` (``guarded_srpf.slack``) in ``config``."""
    value: Any = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


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
    return json_object(raw, ConfigError, CONFIG_ENV)


def _suggestion(close: Iterable[str]) -> str:
    """The end of an unknown name's message: the closest accepted names, or where the
    list of them is. The list itself (57 keys) would bury the one line that matters."""
    names = list(close)
    if names:
        return f"did you mean {' or '.join(names)}?"
    return f"no accepted name is close to it; the list is in {KEY_LIST}"


def _close_choice(key: Key, value: Any) -> str:
    """For a key that takes one of a few names: the closest to the refused ``value``, at
    difflib's default similarity (one wrong letter of a three-letter name, ``sjf``, is
    below :data:`_CLOSE`)."""
    if not key.setting.choices or not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, key.setting.choices, n=2)
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


def _in(source: str | None) -> str:
    """Where a value came from, for messages (nothing for values given in code)."""
    return "" if source is None else f" in {source}"


def _from(source: str | None) -> str:
    return "" if source is None else f" from {source}"


def _coerce(key: Key, value: Any, source: str | None) -> Any:
    """Turn a JSON value or an environment string into the key's type, or fail clearly."""
    if key.setting.allow_auto and isinstance(value, str) and value.strip().lower() == AUTO:
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
            result = key.setting.normalise(value.strip())
        else:
            raise AssertionError(f"no coercion for {key.kind}")
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(
            f"fairsched config: {key.path}{_from(source)} must be {key.accepted}; "
            f"got {value!r}"
        ) from None
    if not key.setting.check(result):
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
