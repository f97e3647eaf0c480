"""Run vLLM's own scheduler tests (``tests/v1/core/`` of vLLM's source release) against the
plugin's scheduler classes, or against stock vLLM.

Why: the plugin wraps vLLM's ``schedule()`` and re-orders its queues; vLLM's own unit tests
are the most complete statement of what vLLM's scheduler promises (preemption, prefix
caching, KV connectors, spec decode, structured output, pause states, priority). Running
them with every ``Scheduler`` they build replaced by the plugin's class shows which of
those promises the plugin keeps.

How:

1. ``sources.ensure_sdist`` finds the release's sdist under ``.cache/vllm-src/``
   (downloading it from PyPI when missing) and checks its sha256. The installed vLLM
   (0.32.0) runs its own tests; another release runs its tests over its Python-source
   overlay (``.cache/vllm-overlays/<version>``, ``scripts/vllm_overlays.sh``) first on
   ``PYTHONPATH``, as the project's per-release scheduler tests do.
2. :func:`prepare_tree` extracts ``tests/v1/core/`` and the helper modules it imports
   (``tests/v1/kv_connector/unit/utils.py`` and the packages' ``__init__.py``) into
   ``.cache/vllm-upstream-tests/<version>/``, adds a small root ``conftest.py`` (vLLM's own
   imports half of vLLM's test dependencies; only two logging fixtures are used here),
   and weightless local copies of ``facebook/opt-125m`` (the model ``create_scheduler``
   names) and ``opt-350m`` (CI machines have no network): the tests' hub names are
   rewritten to their paths.
3. :func:`run_suite` runs pytest on the selected files in a subprocess with
   ``-p fairsched_swap``: under ``mode="plugin"`` that pytest plugin replaces
   ``vllm.v1.core.sched.scheduler.Scheduler`` with ``FairSyncScheduler`` and
   ``vllm.v1.core.sched.async_scheduler.AsyncScheduler`` with ``FairScheduler`` before any
   test module is imported, so ``from vllm.v1.core.sched.scheduler import Scheduler`` in
   the tests and their ``create_scheduler`` build the plugin's classes (subclasses the
   tests define inherit from the plugin's classes too). The policy comes from
   ``FAIRSCHED_POLICY`` as in a real deployment. It also bounds every test's time (a
   scheduler that never drains would otherwise hang a ``while`` loop) and writes each test
   id's outcome to a JSON file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from collections.abc import Mapping
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vllm_upstream.sources import SDISTS, extract  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

INSTALLED_VERSION = "0.32.0"
"""The vLLM of the project's venv; other releases run over their overlays."""
UPSTREAM_VERSIONS = ("0.32.0", "0.33.0", "0.34.0")
"""Releases whose own tests run against the plugin (each one's sdist is pinned in
``sources.SDISTS``)."""
OVERLAYS = REPO / ".cache" / "vllm-overlays"


def tree_root(version: str) -> Path:
    # Resolved: .cache may be a symlink, and pytest's test ids are relative to the real
    # rootdir.
    return (REPO / ".cache").resolve() / "vllm-upstream-tests" / version


# The files run: those that build a Scheduler and drive it, i.e. exercise the plugin. The
# rest of tests/v1/core/ does not: KV cache manager, block pool, encoder cache and output
# types never construct a scheduler; test_kv_cache_utils.py builds only SchedulerConfig
# objects (KV sizing); test_mamba_align_chunk_split.py calls the inherited
# Scheduler._mamba_block_aligned_split on a stub; test_scheduler_e2e.py,
# test_reset_prefix_cache_e2e.py and prefix_cache/ start engines on hub models (no network
# in CI; the project's real-server tests cover the engine). Running them would cost CI time
# and test nothing of the plugin. The selection takes about 50 s on stock and 60-100 s per
# policy on the project's loaded 2-core machine.
SELECTED_FILES: tuple[str, ...] = (
    "tests/v1/core/test_scheduler.py",
    "tests/v1/core/test_async_scheduler.py",
    "tests/v1/core/test_priority_preemption_bug.py",
    "tests/v1/core/test_priority_scheduler_random.py",
    "tests/v1/core/test_deferred_block_free.py",
    "tests/v1/core/test_prefix_replay.py",
    "tests/v1/core/test_swa_inflight_window_free.py",
    "tests/v1/core/test_worker_slot_overflow.py",
    "tests/v1/core/test_prefix_caching.py",
)

DRAIN_TEST = "tests/v1/core/test_fairsched_drain.py"
"""The project's own check of vLLM's newer scheduler paths (``drain_under_policy.py``),
placed among vLLM's tests so that it runs on their helpers; not in :data:`SELECTED_FILES`."""

# Members of the sdist extracted besides tests/v1/core/: the helpers it imports.
EXTRA_MEMBERS: tuple[str, ...] = (
    "tests/__init__.py",
    "tests/v1/__init__.py",
    "tests/v1/kv_connector/__init__.py",
    "tests/v1/kv_connector/unit/__init__.py",
    "tests/v1/kv_connector/unit/utils.py",
)

# facebook/opt-125m's config.json (the fields vLLM reads), for a weightless local copy.
OPT_125M_CONFIG = {
    "_name_or_path": "facebook/opt-125m",
    "activation_dropout": 0.0,
    "activation_function": "relu",
    "architectures": ["OPTForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 2,
    "do_layer_norm_before": True,
    "dropout": 0.1,
    "eos_token_id": 2,
    "enable_bias": True,
    "ffn_dim": 3072,
    "hidden_size": 768,
    "init_std": 0.02,
    "layerdrop": 0.0,
    "max_position_embeddings": 2048,
    "model_type": "opt",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 1,
    "prefix": "</s>",
    "torch_dtype": "float16",
    "transformers_version": "4.21.0.dev0",
    "use_cache": True,
    "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}

# Outcomes as recorded by fairsched_swap: "passed", "failed" (the call failed),
# "error" (setup or teardown failed), "skipped", "timeout" (a failed call that hit the
# per-test limit), "collect-error" (a module that did not import; keyed by its path).
FAILING = frozenset({"failed", "error", "timeout", "collect-error"})


def overlay(version: str) -> Path | None:
    """The Python-source overlay ``version``'s tests run over (None for the installed
    vLLM), built on first use."""
    import vllm

    if version == INSTALLED_VERSION:
        if vllm.__version__ != INSTALLED_VERSION:
            raise RuntimeError(f"installed vLLM is {vllm.__version__}, expected "
                               f"{INSTALLED_VERSION}")
        return None
    path = OVERLAYS / version
    if not (path / ".fairsched-overlay").is_file():
        subprocess.run(["bash", str(REPO / "scripts" / "vllm_overlays.sh"), version],
                       check=True, cwd=REPO)
    return path


# facebook/opt-350m differs from opt-125m in these fields (test_priority_preemption_bug.py).
OPT_350M_CHANGES = {
    "_name_or_path": "facebook/opt-350m",
    "do_layer_norm_before": False,
    "ffn_dim": 4096,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "word_embed_proj_dim": 512,
}
HUB_MODELS = {
    "facebook/opt-125m": OPT_125M_CONFIG,
    "facebook/opt-350m": {**OPT_125M_CONFIG, **OPT_350M_CHANGES},
}


def _write_models(root: Path) -> dict[str, Path]:
    """Weightless local copies of the hub models the selected tests name (config only:
    the scheduler tests never load weights or a tokenizer)."""
    paths = {}
    for name, config in HUB_MODELS.items():
        model = root / "models" / name.split("/")[1]
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text(json.dumps(config, indent=2))
        paths[name] = model
    return paths


ROOT_CONFTEST = '''"""Root conftest of the extracted vLLM tests (written by the fairsched harness).

vLLM's own tests/conftest.py imports much of vLLM's test stack (PIL, tblib, HF model
runners); tests/v1/core/ uses only these two fixtures from it, copied as they are."""

import logging

import pytest


@pytest.fixture()
def temporary_enable_log_propagate():
    logger = logging.getLogger("vllm")
    previous_propagate = logger.propagate
    logger.propagate = True
    yield
    logger.propagate = previous_propagate


@pytest.fixture()
def caplog_vllm(temporary_enable_log_propagate, caplog):
    with caplog.at_level(logging.INFO):
        yield caplog
'''


def prepare_tree(version: str = INSTALLED_VERSION) -> Path:
    """Extract ``version``'s tests once per sdist into :func:`tree_root`; returns it."""
    root = tree_root(version)
    stamp = root / ".fairsched-stamp"
    # The stamp covers what the harness writes into the tree, so a change here re-extracts.
    want = hashlib.sha256(
        (SDISTS[version][1] + ROOT_CONFTEST + json.dumps(HUB_MODELS)).encode()
        + (HERE / "fairsched_swap.py").read_bytes()
        + (HERE / "drain_under_policy.py").read_bytes()
    ).hexdigest()
    if stamp.exists() and stamp.read_text() == want:
        return root
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    extract(version, root,
            lambda name: name.startswith("tests/v1/core/") or name in EXTRA_MEMBERS)
    models = _write_models(root)
    for path in (root / "tests").rglob("*.py"):
        text = original = path.read_text()
        for name, model in models.items():
            text = text.replace(json.dumps(name), json.dumps(str(model)))
        if text != original:
            path.write_text(text)
    (root / "tests" / "conftest.py").write_text(ROOT_CONFTEST)
    (root / "pytest.ini").write_text("[pytest]\n")
    shutil.copy(HERE / "fairsched_swap.py", root / "fairsched_swap.py")
    shutil.copy(HERE / "drain_under_policy.py", root / DRAIN_TEST)
    stamp.write_text(want)
    return root


@dataclass(frozen=True)
class SuiteResult:
    """Outcome per test id, and how long the pytest run took."""

    outcomes: dict[str, str]
    built: dict[str, int]
    messages: dict[str, str]
    seconds: float
    returncode: int
    log: str

    def failing(self) -> set[str]:
        return {test for test, outcome in self.outcomes.items() if outcome in FAILING}

    def passed(self) -> set[str]:
        return {test for test, outcome in self.outcomes.items() if outcome == "passed"}

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for outcome in self.outcomes.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        return counts


_PREPARING = threading.Lock()
"""Held while a run extracts its release's tests or builds its overlay."""


def run_suite(
    mode: str,
    policy: str = "fcfs",
    files: tuple[str, ...] = SELECTED_FILES,
    per_test_timeout_s: int = 120,
    extra_args: tuple[str, ...] = (),
    fairsched_env: Mapping[str, str] | None = None,
    version: str = INSTALLED_VERSION,
) -> SuiteResult:
    """Run ``files`` of ``version``'s extracted tests under ``mode`` ("stock" or "plugin")
    and, for the plugin, ``FAIRSCHED_POLICY=policy`` plus ``fairsched_env`` (more
    ``FAIRSCHED_*`` settings, e.g. ``{"FAIRSCHED_APC_ENABLED": "true"}``); inherited
    ``FAIRSCHED_*`` variables are dropped so that the run is what the caller asked for."""
    if mode not in ("stock", "plugin"):
        raise ValueError(mode)
    with _PREPARING:  # runs may start side by side (tests/paired_jobs.py)
        root = prepare_tree(version)
        sources = overlay(version)
    results = root / f"results-{mode}-{policy}-{uuid.uuid4().hex}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRSCHED_")}
    env.update(
        UPSTREAM_SWAP_MODE=mode,
        UPSTREAM_SWAP_RESULTS=str(results),
        UPSTREAM_SWAP_TIMEOUT_S=str(per_test_timeout_s),
        # No network: a test that needs the hub fails at once instead of retrying.
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_LOGGING_LEVEL=env.get("VLLM_LOGGING_LEVEL", "WARNING"),
        # The extracted tree first (its ``tests`` package), the release's sources where
        # they are not the installed ones, then this work tree's plugin.
        PYTHONPATH=os.pathsep.join(
            [str(root), *([str(sources)] if sources else []), str(REPO),
             env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    if sources is not None:
        env["VLLM_TARGET_DEVICE"] = "cpu"  # an sdist overlay has no platform of its own
    if mode == "plugin":
        env.update(fairsched_env or {})
        env["FAIRSCHED_POLICY"] = policy
    cmd = [
        sys.executable, "-m", "pytest", "-p", "fairsched_swap", "-p", "no:cacheprovider",
        "-q", "--no-header", "-rN", "--rootdir", str(root), "-c", str(root / "pytest.ini"),
        *extra_args, *files,
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if not results.exists():
        raise RuntimeError(f"no results from {cmd}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    outcomes = json.loads(results.read_text())
    results.unlink()
    meta = outcomes.pop("__meta__")
    return SuiteResult(outcomes, meta["built"], meta["messages"], seconds, proc.returncode, proc.stdout + proc.stderr)


def main(argv: list[str] | None = None) -> int:
    """``python tests/vllm_upstream/harness.py [--vllm VERSION] stock|plugin [POLICY]
    [FILE...]``: run and print the failing tests (for regenerating the lists by hand).
    ``FAIRSCHED_*`` variables of the calling shell (other than the policy) are passed to the
    plugin run, to try other settings:
    ``FAIRSCHED_APC_ENABLED=true python tests/vllm_upstream/harness.py plugin aging``."""
    args = list(sys.argv[1:] if argv is None else argv)
    version = INSTALLED_VERSION
    if args[:1] == ["--vllm"]:
        version = args[1]
        del args[:2]
    mode = args.pop(0) if args else "stock"
    policy = args.pop(0) if args and mode == "plugin" else "fcfs"
    files = tuple(args) or SELECTED_FILES
    extra = {k: v for k, v in os.environ.items()
             if k.startswith("FAIRSCHED_") and k != "FAIRSCHED_POLICY"}
    result = run_suite(mode, policy, files, fairsched_env=extra, version=version)
    print(json.dumps({"vllm": version, "mode": mode, "policy": policy, "env": extra,
                      "seconds": round(result.seconds, 1),
                      "counts": result.counts(), "built": result.built}))
    for test in sorted(result.failing()):
        print(result.outcomes[test], test, "|", result.messages.get(test, ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
