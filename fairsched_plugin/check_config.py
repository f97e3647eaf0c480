"""``fairsched check-config``: a configuration checked as vLLM start-up checks it, without
starting or importing vLLM.

Start-up checks the settings in the API server (the general plugin's launch check,
``plugin.py``), in the platform's config check on vLLM-Ascend (``adapter/ascend.py``) and in
the engine core (the scheduler module's vLLM release check, then the scheduler's
``__init__``: the policy, the latency model, the profile file). This command calls those
same functions, in that order, on the same inputs: the ``--additional-config`` JSON an
operator passes to ``vllm serve`` and this process's ``FAIRSCHED_*`` environment. A
failure prints exactly the message start-up would stop with. Importing vLLM takes 20 s
or more, so what needs vLLM's classes or a running engine is not checked (:data:`NOT_CHECKED`).

One check is stricter than start-up: fairsched keys beside the ``fairsched`` object rather
than in it. Start-up logs a warning and runs without them (refusing would stop a running
deployment on an upgrade); this command, run before a restart, refuses them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .adapter.ascend import check_ascend_scheduler_settings
from .adapter.compat import TESTED_VLLM, UnsupportedVllmError, check_vllm_version
from .config import (
    ADDITIONAL_CONFIG_KEY,
    AUTO,
    CONFIG_ENV,
    KEYS,
    STRICT_VLLM_ENV,
    ConfigError,
    FairschedConfig,
    accepted_keys,
    key_value,
    load_config,
    misplaced_keys,
    misplaced_message,
    resolve_auto_switches,
)
from .policies.lprs import AUTO_TARGET_TOKENS
from .policies.registry import make_policy
from .predictor.environment import vllm_version
from .predictor.profiling import ProfileError, check_resumable
from .predictor.runtime import LatencyPredictor, PredictorError
from .user_files import UserFileError, read_text

VERB = "check-config"
EXIT_OK = 0
EXIT_REFUSED = 1
"""Start-up would stop with the message printed, or would warn that it ignores fairsched
keys outside the ``fairsched`` object and run without them."""
EXIT_UNREADABLE = 2
"""This command could not read its own input (also argparse's status for a usage error)."""

STARTUP_ERRORS = (ConfigError, PredictorError, ProfileError, UnsupportedVllmError)

CHECKED = (
    "fairsched keys beside the 'fairsched' object of --additional-config instead of in it "
    "(start-up warns and ignores them; this command refuses them)",
    "every key, type and range, and the rules between keys (config.load_config), from "
    "FAIRSCHED_CONFIG, the FAIRSCHED_* variables and --additional-config, in start-up's "
    "order of precedence",
    "vLLM-Ascend scheduler settings in the same --additional-config that would replace "
    "fairsched's scheduler (start-up checks them on an NPU platform only; elsewhere they "
    "mean nothing)",
    "the installed vLLM release against the tested range and FAIRSCHED_STRICT_VLLM (read "
    "from the package metadata, not imported)",
    "building the selected policy",
    "with lprs.enabled and predictor.path: ONNX Runtime installed and importable, the "
    "latency model at predictor.path loaded on predictor.provider (a provider this ONNX "
    "Runtime lacks is start-up's warning, and the CPU) and its metadata checked; without "
    "predictor.path, the built-in model's predictor.model and predictor.device presets",
    "with profile.path: an existing profile file can be appended to",
)
NOT_CHECKED = (
    "whether this vLLM's scheduler has every hook fairsched needs (start-up reads vLLM's "
    "classes; a release newer than the tested range starts only if they are all found)",
    "the scheduler class: whether --scheduler-cls, FAIRSCHED_POLICY or a platform setting "
    "ends up selecting another class than fairsched's",
    "the memory provider profile.memory selects in the engine (torch and nvml need the "
    "engine's process), so a latency model or profile is compared with it only when "
    "profile.memory names one",
    "whether the trace and profile files can be created (nothing is written here)",
    "paths as the engine sees them: relative ones are resolved against this command's "
    "directory, and under data parallelism start-up adds each engine's index to the "
    "trace and profile paths",
)
_LOGGER = "vllm.fairsched"


class UnreadableInput(Exception):
    """This command's own input (``--additional-config`` or ``--file``) cannot be read: a
    problem with the command line, not a message start-up would give."""


class MisplacedKeys(Exception):
    """Fairsched keys outside the ``fairsched`` object: start-up's warning, which this
    command turns into a refusal, since the launch would silently run without them."""


@dataclass(frozen=True)
class Setting:
    """One resolved key: its value and the source it came from."""

    key: str
    value: Any
    source: str


@dataclass(frozen=True)
class Report:
    """What a configuration that passed resolves to, and what the checks found."""

    settings: list[Setting]
    notes: list[str]


def read_additional_config(text: str, origin: str) -> dict[str, Any]:
    """The ``--additional-config`` object in ``text`` (from ``origin``, for messages)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UnreadableInput(f"fairsched {VERB}: {origin} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UnreadableInput(
            f"fairsched {VERB}: {origin} must hold a JSON object such as "
            f'{{"{ADDITIONAL_CONFIG_KEY}": {{"policy": "aging"}}}}, got {type(data).__name__}')
    return data


def read_file(path: Path) -> dict[str, Any]:
    """The ``--additional-config`` object stored in the file at ``path``."""
    try:
        text = read_text(path)
    except UserFileError as exc:  # its message starts with the path
        raise UnreadableInput(f"fairsched {VERB}: --file {exc}") from None
    return read_additional_config(text, f"--file {path}")


def check(additional_config: Mapping[str, Any] | None, environ: Mapping[str, str],
          origin: str = "--additional-config") -> Report:
    """Run start-up's checks in start-up's order; raise the first error start-up would
    raise (one of :data:`STARTUP_ERRORS`). ``origin`` names where ``additional_config``
    came from in the report and the messages.

    First, refuse (:class:`MisplacedKeys`) fairsched keys that start-up would ignore for
    being outside the ``fairsched`` object: checked before ``load_config``, which would
    only log the same message as a warning."""
    misplaced = misplaced_keys(additional_config)
    if misplaced:
        raise MisplacedKeys(misplaced_message(origin, additional_config or {}, misplaced))
    config = load_config(additional_config, environ)
    check_ascend_scheduler_settings(additional_config)
    notes = [_vllm_release(environ)]
    make_policy(config)
    # The engine's provider under "auto" is decided in its own process: not known here.
    memory = None if config.profile.memory == "auto" else config.profile.memory
    if config.lprs.enabled and config.predictor.path:
        predictor = LatencyPredictor.from_config(config.predictor, memory)
        notes.append(_predictor_note(predictor, memory, config))
    elif config.lprs.enabled:
        notes.append(_built_in_note(config))
    if config.lprs.enabled and config.lprs.target_ms == AUTO:
        notes.append(f"lprs.target_ms auto: LPRS aims at the predicted time of a step "
                     f"prefilling {AUTO_TARGET_TOKENS} tokens (the token budget when smaller) "
                     "and nothing else; the start-up line gives it in ms")
    if config.profile.path and check_resumable(Path(config.profile.path), memory):
        notes.append(f"profile.path {config.profile.path}: start-up appends to the "
                     "profile there")
    return Report(_settings(config, additional_config, environ, origin), notes)


def _vllm_release(environ: Mapping[str, str]) -> str:
    version = vllm_version()
    low, high = TESTED_VLLM
    if version == "not installed":
        return ("vLLM is not installed in this environment: its release was not checked "
                "(run this command in vLLM's environment)")
    if check_vllm_version(version, environ):
        return (f"vLLM {version} is newer than the tested range (>={low},<{high}): start-up "
                "goes on, with a warning, only if every scheduler hook is found")
    return f"vLLM {version}: in the tested range (>={low},<{high})"


def _built_in_note(config: FairschedConfig) -> str:
    """What the built-in latency model will start from (the device is detected by the
    engine, not here)."""
    predictor = config.predictor
    model = ("the served model's config" if predictor.model == "auto"
             else f"model {predictor.model}")
    device = ("the accelerator the engine detects (none known on a CPU: it then learns "
              "from measured steps and LPRS plans as the token budget does until it fits)"
              if predictor.device == "auto" else f"device {predictor.device}")
    return (f"LPRS uses the built-in latency model (no predictor.path): the roofline of "
            f"{model} on {device}, fitted online to measured step times")


def _predictor_note(predictor: LatencyPredictor, memory: str | None,
                    config: FairschedConfig) -> str:
    recorded = predictor.metadata["memory_provider"]
    note = (f"latency model {predictor.path}: loads on {predictor.provider}, trained with "
            f"memory provider {recorded!r}")
    if memory is None and not config.predictor.allow_memory_mismatch:
        note += ("; start-up refuses it if the provider profile.memory=auto picks in the "
                 "engine is another one")
    return note


def _settings(config: FairschedConfig, additional_config: Mapping[str, Any] | None,
              environ: Mapping[str, str], origin: str) -> list[Setting]:
    """The policy and every key whose value is not the default, with its source."""
    section = (additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
    # The "auto" switches resolve by policy: compare with their value under this one.
    defaults = resolve_auto_switches(FairschedConfig(policy=config.policy))
    out = []
    for key in KEYS:
        value, default = key_value(config, key.path), key_value(defaults, key.path)
        if key.path != "policy" and value == default:
            continue
        if isinstance(section, Mapping) and _sets(section, key.path):
            source = origin
        elif key.env_name in environ:
            source = key.env_name
        elif CONFIG_ENV in environ and value != default:
            source = CONFIG_ENV  # the only source left that can set a value
        else:
            source = "default"
        out.append(Setting(key.path, value, source))
    return out


def _sets(section: Mapping[str, Any], path: str) -> bool:
    """Whether ``section`` (nested objects, dotted names or both) gives ``path``."""
    if path in section:
        return True
    return any(isinstance(value, Mapping) and path.startswith(name + ".")
               and _sets(value, path[len(name) + 1:]) for name, value in section.items())


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return json.dumps(value) if value == "" else str(value)


def render(report: Report) -> str:
    """The report as printed on success."""
    width = max(len(f"{s.key} = {_shown(s.value)}") for s in report.settings)
    lines = ["fairsched configuration: start-up would accept it."]
    for setting in report.settings:
        line = f"{setting.key} = {_shown(setting.value)}"
        lines.append(f"  {line:<{width}}  ({setting.source})")
    lines.append("  every other key: its default")
    lines += report.notes
    lines.append(f"Not checked here (they need vLLM or the engine): see fairsched {VERB} -h.")
    return "\n".join(lines)


def key_list() -> str:
    """Every key with its variable and accepted values, then the two variables that are
    not keys: what ``--list-keys`` prints, where an unknown name's message points."""
    return (f"{accepted_keys()}\n"
            f"  {CONFIG_ENV}: a JSON object with the keys above, inline or as a file path\n"
            f"  {STRICT_VLLM_ENV}: 1 refuses a vLLM newer than the tested range (not a key)")


def main(args: argparse.Namespace) -> int:
    """Print the resolved settings (0), start-up's error or the misplaced keys (1), or
    what could not be read (2); with ``--list-keys``, every accepted key (0)."""
    if args.list_keys:
        print(key_list())
        return EXIT_OK
    try:
        if args.file is not None:
            additional, origin = read_file(args.file), f"--file {args.file}"
        elif args.additional_config is not None:
            additional = read_additional_config(args.additional_config, "--additional-config")
            origin = "--additional-config"
        else:
            additional, origin = None, "--additional-config"
    except UnreadableInput as exc:
        print(exc, file=sys.stderr)
        return EXIT_UNREADABLE
    # Start-up's warnings (an execution provider that falls back to CPU, a memory
    # mismatch allowed) go to the "vllm.fairsched" logger; show them as start-up would.
    logger = logging.getLogger(_LOGGER)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    try:
        report = check(additional, os.environ, origin)
    except STARTUP_ERRORS as exc:
        print(exc, file=sys.stderr)
        return EXIT_REFUSED
    except MisplacedKeys as exc:
        print(f"{exc}\nerror: fairsched {VERB} refuses these settings: start-up would "
              "only log this warning and run without them", file=sys.stderr)
        return EXIT_REFUSED
    finally:
        logger.removeHandler(handler)
    print(render(report))
    return EXIT_OK


def _bullets(items: tuple[str, ...]) -> str:
    return "\n".join(f"  - {item}" for item in items)


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register ``check-config``; its module imports neither vLLM nor torch."""
    parser = subparsers.add_parser(
        VERB,
        help="check a fairsched configuration as vLLM start-up does, without starting vLLM",
        description=(
            "Checks the configuration vLLM start-up would read: --additional-config (or "
            "--file), the FAIRSCHED_* variables of this process and FAIRSCHED_CONFIG, with "
            "start-up's precedence, through the functions start-up calls. On success it "
            "prints the policy and every key that is not its default, with where each "
            "came from. Otherwise it prints the error start-up would stop with. Run it "
            "in vLLM's environment and with the engine's FAIRSCHED_* variables.\n\n"
            f"Checked:\n{_bullets(CHECKED)}\n\n"
            f"Not checked (they need vLLM's classes or the running engine):\n"
            f"{_bullets(NOT_CHECKED)}"),
        epilog=(f"Exit status: {EXIT_OK} start-up would accept the configuration; "
                f"{EXIT_REFUSED} start-up would stop, with the message printed on stderr, or "
                "would ignore fairsched keys placed outside the 'fairsched' object; "
                f"{EXIT_UNREADABLE} the command line or the --file could not be read."))
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--additional-config", metavar="JSON",
        help='the JSON given to vllm serve --additional-config, e.g. '
             '\'{"fairsched": {"policy": "aging"}}\' (default: none, as when vLLM gets '
             'no --additional-config)')
    source.add_argument(
        "--file", type=Path, metavar="PATH",
        help="a JSON file holding the same object as --additional-config (default: none)")
    source.add_argument(
        "--list-keys", action="store_true",
        help="print every key, its FAIRSCHED_* variable and what it accepts, and exit")
    parser.set_defaults(func=main)
