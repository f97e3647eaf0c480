"""Serve a latency model with ONNX Runtime: one session, batched calls.

Per step, LPRS scores its prefill candidates' chunk sizes in batched ``predict`` calls,
usually one (two when the target binds anew; ``policies/chunk_rule.py``). The batch as
dispatched, for the online bias and the guard, reuses the prediction of the row LPRS
scored for it, and takes a single-row call of its own only when vLLM dispatched another.

The execution provider comes from config: ``cpu`` (default), ``cuda`` (``onnxruntime-gpu``)
or ``cann`` (``onnxruntime-cann``, Ascend). The CPU provider with one thread is the right
choice almost everywhere: a 16-128-64-32-1 MLP costs tens of microseconds on one core,
while a device provider adds copies and a queue behind the model's own forward pass, and
ONNX Runtime's default thread pool shows millisecond P99 spikes when the engine keeps the
cores busy. A requested provider this ONNX Runtime build lacks, or one that fails to
start, is logged on ``vllm.fairsched`` and the model runs on CPU.

At load the model's ``fairsched`` metadata is checked against this code's feature
definition (``model_format``); a missing, corrupt or mismatched file raises
:class:`PredictorError` naming the file and the problem, so a bad model stops start-up.

**Inputs are clamped into the training range.** A model whose metadata records
``feature_ranges`` (the minimum and maximum of each feature over its training split) gets
every input clamped into them before ONNX Runtime sees it. An MLP extrapolates wildly
outside what it saw: a model trained on another engine, GPU, model or vLLM version can see
memory features far outside its profile and predict nonsense (or negative) times for every
batch, which would drive LPRS to one-token chunks. Clamped, an out-of-range feature reads
as the nearest value the model was trained on. ``outside_range`` names the features of a
row that were clamped, for the trace. A model without ranges is served unclamped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnxruntime as ort

from ..user_files import json_object
from ..extras import INSTALL_HINT
from .features import FEATURE_NAMES, NUM_FEATURES
from .model_format import FORMAT_VERSION, INPUT_NAME, METADATA_KEY, OUTPUT_NAME

logger = logging.getLogger("vllm.fairsched")

CPU = "CPUExecutionProvider"
EXECUTION_PROVIDERS = {
    "cpu": CPU,
    "cuda": "CUDAExecutionProvider",
    "cann": "CANNExecutionProvider",
}
_ARENA_LIMIT = str(64 << 20)
# Defaults keep a device provider's memory arena small (its allocations are outside
# vLLM's memory budget) and, on Ascend, the MLP in fp32: CANN's default force_fp16 would
# overflow the large interaction features before normalisation.
DEFAULT_PROVIDER_OPTIONS: dict[str, dict[str, str]] = {
    "cpu": {},
    "cuda": {"arena_extend_strategy": "kSameAsRequested", "gpu_mem_limit": _ARENA_LIMIT},
    "cann": {
        "arena_extend_strategy": "kSameAsRequested",
        "npu_mem_limit": _ARENA_LIMIT,
        "enable_cann_graph": "1",
        "dump_om_model": "0",
        "precision_mode": "must_keep_origin_dtype",
    },
}
# Options the providers parse (ONNX Runtime 1.24), besides device_id; others are refused
# here rather than by the provider, whose refusal would only fall back to CPU.
ACCEPTED_PROVIDER_OPTIONS: dict[str, frozenset[str]] = {
    "cpu": frozenset(),
    "cuda": frozenset({
        "gpu_mem_limit", "arena_extend_strategy", "cudnn_conv_algo_search",
        "do_copy_in_default_stream", "enable_cuda_graph", "use_tf32",
        "use_ep_level_unified_stream", "prefer_nhwc", "tunable_op_enable",
        "tunable_op_tuning_enable",
    }),
    "cann": frozenset({
        "npu_mem_limit", "arena_extend_strategy", "enable_cann_graph", "enable_cann_subgraph",
        "dump_graphs", "dump_om_model", "op_select_impl_mode", "optypelist_for_implmode",
        "precision_mode",
    }),
}
# CANN compiles the graph once per input shape; padding the batch to a power of two
# (at least this) keeps the number of compiled shapes small.
CANN_MIN_BATCH = 16


class PredictorError(ValueError):
    """A latency model that cannot be served; the message names the file and the problem."""


PREDICTOR_INSTALL = ("the 'predictor' extra (ONNX Runtime for the CPU; 'predictor-cuda' "
                     "or 'predictor-cann' for a device provider): "
                     + INSTALL_HINT.format(extra="predictor"))
"""How to install ONNX Runtime with the plugin. The package is on no index, so the
extra is installed from the wheel file or a checkout (``extras.INSTALL_HINT``)."""


def onnxruntime() -> Any:
    """ONNX Runtime, imported on first use of the predictor only: the base install (numpy
    only) runs every other feature without it. Missing, or a build that fails to import
    (``onnxruntime-cann`` 1.24 with numpy 2), it is a :class:`PredictorError` naming the
    extra to install, so LPRS stops start-up instead of running without its model."""
    try:
        import onnxruntime as ort_module
    except ModuleNotFoundError as exc:
        if exc.name != "onnxruntime":
            raise _broken_onnxruntime(exc) from None
        raise PredictorError(
            "the latency predictor (LPRS, predictor.path) needs ONNX Runtime, which is not "
            f"installed; install {PREDICTOR_INSTALL}"
        ) from None
    except Exception as exc:  # a build compiled against another numpy, a missing library
        raise _broken_onnxruntime(exc) from None
    return ort_module


def _broken_onnxruntime(exc: BaseException) -> PredictorError:
    return PredictorError(
        f"ONNX Runtime is installed but fails to import ({type(exc).__name__}: {exc}). "
        "onnxruntime-cann 1.24 needs numpy<2, which vLLM's dependencies do not allow; "
        "install the CPU build instead (pip uninstall onnxruntime-cann, then "
        f"{INSTALL_HINT.format(extra='predictor')}), which serves the latency model on the "
        "host CPU, the recommended provider on Ascend"
    )


class LatencyPredictor:
    """A loaded, checked latency model. ``predict`` scores many feature rows in one call;
    LPRS sees it as a ``policies.chunk_rule.BatchLatencyModel``."""

    def __init__(self, session: ort.InferenceSession, path: Path, metadata: dict[str, Any]):
        self.path = path
        self.metadata = metadata
        self.provider = session.get_providers()[0]
        self._session = session
        self._pad = self.provider == EXECUTION_PROVIDERS["cann"]
        ranges = metadata.get("feature_ranges")
        self.feature_low: np.ndarray | None = None
        """Each feature's training minimum (None: the model records no ranges)."""
        self.feature_high: np.ndarray | None = None
        self._ranges: list[tuple[str, float, float]] | None = None
        if ranges is not None:
            self.feature_low = np.array([ranges[n][0] for n in FEATURE_NAMES], np.float32)
            self.feature_high = np.array([ranges[n][1] for n in FEATURE_NAMES], np.float32)
            self._ranges = [(name, float(low), float(high)) for name, low, high
                            in zip(FEATURE_NAMES, self.feature_low, self.feature_high)]

    @classmethod
    def load(
        cls,
        path: str | Path,
        provider: str = "cpu",
        device_id: int = 0,
        threads: int = 1,
        expected_memory_provider: str | None = None,
        allow_memory_mismatch: bool = False,
        provider_options: Mapping[str, str] | None = None,
    ) -> LatencyPredictor:
        """Open ``path`` on ``provider`` and check it (see the module docstring).

        ``expected_memory_provider``: the provider serving will read memory with; a model
        trained on another one is refused unless ``allow_memory_mismatch``.
        ``provider_options`` are added to (and override) ``DEFAULT_PROVIDER_OPTIONS``.
        """
        onnxruntime()  # a missing or broken ONNX Runtime is the first thing to fix
        path = Path(path)
        options = _provider_options(provider, device_id, threads, provider_options)
        if not path.is_file():
            raise PredictorError(f"latency model {path}: no such file")
        session = _open_session(path, EXECUTION_PROVIDERS[provider], options, threads)
        metadata = _checked_metadata(session, path)
        recorded = metadata["memory_provider"]
        if expected_memory_provider is not None and recorded != expected_memory_provider:
            if not allow_memory_mismatch:
                raise PredictorError(
                    f"latency model {path}: trained on memory provider {recorded!r}, but this "
                    f"engine reads memory with {expected_memory_provider!r}; its memory "
                    "features would mean something else. Train a model here, select memory "
                    f"provider {recorded!r}, or set predictor.allow_memory_mismatch"
                )
            logger.warning(
                "fairsched: latency model %s was trained on memory provider %r and is served "
                "with %r (allow_memory_mismatch is set)", path, recorded,
                expected_memory_provider,
            )
        return cls(session, path, metadata)

    @classmethod
    def from_config(cls, predictor_config: Any,
                    memory_provider_name: str | None) -> LatencyPredictor:
        """Load the model ``fairsched_plugin.config.PredictorConfig`` describes, for an
        engine reading memory with ``memory_provider_name`` (None: not known, so not
        compared; ``fairsched check-config`` has no engine to ask)."""
        if not predictor_config.path:
            raise PredictorError("predictor.path is empty: no latency model configured")
        return cls.load(
            predictor_config.path,
            provider=predictor_config.provider,
            device_id=predictor_config.device_id,
            threads=predictor_config.threads,
            expected_memory_provider=memory_provider_name,
            allow_memory_mismatch=predictor_config.allow_memory_mismatch,
            provider_options=(
                {"precision_mode": predictor_config.precision_mode}
                if predictor_config.provider == "cann" else None),
        )

    def predict(self, rows: np.ndarray) -> np.ndarray:
        """Predicted latency in ms, shape (n,), for ``rows`` of the 16 features (n, 16),
        each feature clamped into the training range when the model records one."""
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        if rows.ndim != 2 or rows.shape[1] != NUM_FEATURES:
            raise ValueError(f"predict needs rows of {NUM_FEATURES} features, got shape "
                             f"{rows.shape}")
        if self.feature_low is not None:
            rows = np.minimum(np.maximum(rows, self.feature_low), self.feature_high)
        n = rows.shape[0]
        if self._pad:
            rows = np.concatenate([rows, np.zeros((padded_batch(n) - n, NUM_FEATURES),
                                                  np.float32)])
        return self._session.run([OUTPUT_NAME], {INPUT_NAME: rows})[0].reshape(-1)[:n]


    def outside_range(self, row: np.ndarray) -> list[str]:
        """The features of one 16-feature ``row`` outside the training range, which
        :meth:`predict` clamps (none without recorded ranges)."""
        if self._ranges is None:
            return []
        # Plain Python: one row of 16 is faster compared this way than with numpy calls.
        return [name for value, (name, low, high) in zip(row.tolist(), self._ranges)
                if not low <= value <= high]

    def training_range(self, feature: str) -> tuple[float, float]:
        """The lowest and highest value of ``feature`` in the model's training split
        (for a message naming a clamped feature)."""
        if self._ranges is None:
            raise KeyError(f"latency model {self.path} records no training ranges")
        for name, low, high in self._ranges:
            if name == feature:
                return low, high
        raise KeyError(feature)


def padded_batch(n: int) -> int:
    """The batch size a CANN session runs ``n`` rows as: a power of two >= CANN_MIN_BATCH."""
    return max(CANN_MIN_BATCH, 1 << max(n - 1, 0).bit_length())


def _provider_options(
    provider: str, device_id: int, threads: int, extra: Mapping[str, str] | None
) -> dict[str, str]:
    if provider not in EXECUTION_PROVIDERS:
        raise PredictorError(
            f"unknown predictor provider {provider!r}; use one of {', '.join(EXECUTION_PROVIDERS)}"
        )
    if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
        raise PredictorError(f"predictor device_id must be an integer >= 0, got {device_id!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise PredictorError(f"predictor threads must be an integer >= 1, got {threads!r}")
    unknown = sorted(set(extra or {}) - ACCEPTED_PROVIDER_OPTIONS[provider])
    if unknown:
        accepted = ", ".join(sorted(ACCEPTED_PROVIDER_OPTIONS[provider])) or "none"
        raise PredictorError(
            f"predictor provider {provider!r}: unknown option(s) {', '.join(unknown)}; "
            f"accepted: {accepted}"
        )
    options = {**DEFAULT_PROVIDER_OPTIONS[provider], **{k: str(v) for k, v in (extra or {}).items()}}
    if provider != "cpu":
        options["device_id"] = str(device_id)
    return options


def _session_options(threads: int) -> ort.SessionOptions:
    ort = onnxruntime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Spinning threads would take cores from the engine between steps.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return options


def _open_session(
    path: Path, provider: str, options: dict[str, str], threads: int
) -> ort.InferenceSession:
    """A session on ``provider`` if it is available and starts, else on CPU (logged)."""
    ort = onnxruntime()
    available = ort.get_available_providers()
    if provider != CPU and provider not in available:
        logger.warning(
            "fairsched: ONNX Runtime here has no %s (available: %s); the latency model "
            "runs on CPU", provider, ", ".join(available),
        )
        provider = CPU
    chain: list[Any] = [CPU] if provider == CPU else [(provider, options), CPU]
    try:
        session = ort.InferenceSession(str(path), _session_options(threads), providers=chain,
                                       enable_fallback=0)
    except Exception as exc:  # ORT raises its own Fail/InvalidProtobuf/... types
        if provider == CPU:
            raise PredictorError(f"latency model {path}: not a loadable ONNX model ({exc})") from None
        session = _open_session(path, CPU, {}, threads)
        logger.warning("fairsched: %s failed to start (%s); the latency model runs on CPU",
                       provider, exc)
        return session
    if session.get_providers()[0] != provider:
        logger.warning("fairsched: ONNX Runtime did not start %s; the latency model runs on %s",
                       provider, session.get_providers()[0])
    return session


def _checked_metadata(session: ort.InferenceSession, path: Path) -> dict[str, Any]:
    text = session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
    if text is None:
        raise PredictorError(
            f"latency model {path}: no {METADATA_KEY!r} metadata; it was not exported by "
            "'fairsched train'"
        )
    metadata = json_object(text, PredictorError, f"latency model {path}: metadata")
    version = metadata.get("format_version")
    if version != FORMAT_VERSION:
        raise PredictorError(
            f"latency model {path}: format version {version!r}, this code serves version "
            f"{FORMAT_VERSION}; re-export it with this version's 'fairsched train'"
        )
    names = metadata.get("feature_names")
    if names != list(FEATURE_NAMES):
        raise PredictorError(f"latency model {path}: {_feature_difference(names)}")
    if not isinstance(metadata.get("memory_provider"), str):
        raise PredictorError(f"latency model {path}: metadata names no memory_provider")
    ranges = metadata.get("feature_ranges")
    if ranges is not None and not _valid_ranges(ranges):
        raise PredictorError(
            f"latency model {path}: metadata feature_ranges must map each of the "
            f"{NUM_FEATURES} features to [minimum, maximum], finite, minimum <= maximum"
        )
    inputs, outputs = session.get_inputs(), session.get_outputs()
    if (
        [i.name for i in inputs] != [INPUT_NAME]
        or inputs[0].shape[1:] != [NUM_FEATURES]
        or inputs[0].type != "tensor(float)"
        or OUTPUT_NAME not in [o.name for o in outputs]
    ):
        found = ", ".join(f"{i.name} {i.type} {i.shape}" for i in inputs)
        raise PredictorError(
            f"latency model {path}: expected input {INPUT_NAME!r} float (batch, {NUM_FEATURES}) "
            f"and output {OUTPUT_NAME!r}; it has inputs {found} and outputs "
            f"{', '.join(o.name for o in outputs)}"
        )
    return metadata


def _valid_ranges(ranges: Any) -> bool:
    if not isinstance(ranges, dict) or set(ranges) != set(FEATURE_NAMES):
        return False
    for bounds in ranges.values():
        if not (isinstance(bounds, list) and len(bounds) == 2
                and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                        and math.isfinite(v) for v in bounds)
                and bounds[0] <= bounds[1]):
            return False
    return True


def _feature_difference(names: Any) -> str:
    """How the model's feature list differs from ``FEATURE_NAMES``."""
    if not isinstance(names, list):
        return f"metadata feature_names is {names!r}, expected a list of {NUM_FEATURES} names"
    for index, (theirs, ours) in enumerate(zip(names, FEATURE_NAMES)):
        if theirs != ours:
            return (f"feature {index} is {theirs!r} in the model but {ours!r} here; the model "
                    "was trained on another feature definition")
    return (f"the model has {len(names)} features, this code {NUM_FEATURES}; it was trained "
            "on another feature definition")
