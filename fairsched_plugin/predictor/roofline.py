"""The latency model LPRS uses when no trained one is given: nothing to prepare.

Built at start-up from what the engine already knows: the served model's config (layers,
hidden size, heads, KV heads, intermediate size, vocabulary, dtype, quantization, MoE)
and the accelerator it runs on (the CUDA device's name, an Ascend NPU). Its first guess
is the simulator's roofline (``analytic``: FLOPs and bytes per part of a step over
the preset's peak and bandwidth), evaluated from the predictor's 16 batch features.

Then it learns from the step times the engine reports (:meth:`observe`): a least-squares
fit, with older steps forgotten, of the measured time on a few terms of the batch. With a
known accelerator the terms are the roofline's own time and a constant (a wrong preset,
efficiency or overhead comes out as a scale and an offset); on an accelerator it has no
preset for (the CPU, a new GPU) the terms are the batch's tokens, attention pairs, KV
reads and requests, fitted from nothing. Until that fit has seen ``warmup`` steps it
says it is not ready and LPRS plans as the token budget does (stock's chunks); the
predictor guard (``policies.lprs_guard``) then judges its error as for any model.

Only numpy is imported; the scheduler calls :meth:`predict` every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .analytic import elementwise_elements, linear_activation_elements
from .analytic import linear_params_per_layer
from .hardware import ACCELERATORS, Accelerator, PresetError, TransformerConfig
from .hardware import accelerator_key, field_overrides, model_config, transformer_config
from .hardware import with_overrides
from .features import FEATURE_NAMES, BatchStats

_F = {name: FEATURE_NAMES.index(name) for name in FEATURE_NAMES}

DEVICE_NAMES: tuple[tuple[str, str], ...] = (
    ("H200", "h200"), ("H100", "h100"), ("A100", "a100-80gb"), ("4090", "rtx4090"),
    ("RTX PRO 5000", "rtxpro5000"), ("910B", "ascend910b"),
)
"""Substrings of a device name (as CUDA or the NPU runtime reports it) and the preset."""

_QUANTIZED_BYTES = {"fp8": 1, "fbgemm_fp8": 1, "modelopt": 1, "compressed-tensors": 1,
                    "awq": 1, "gptq": 1, "awq_marlin": 1, "gptq_marlin": 1, "bitsandbytes": 1}
"""Bytes per weight the roofline reads under a quantization method (4-bit methods are
counted as 1 byte: their dequantization costs about what the extra half byte would)."""


def preset_for_device(device_type: str, device_name: str) -> str | None:
    """The accelerator preset for a device, or None when there is none (the CPU)."""
    if device_type == "npu":
        return "ascend910b"
    if device_type not in ("cuda", "rocm"):
        return None
    upper = device_name.upper()
    return next((preset for part, preset in DEVICE_NAMES if part.upper() in upper), None)


def served_transformer(hf_config: Any, dtype: str, quantization: str | None,
                       name: str) -> TransformerConfig:
    """The served model's shape from vLLM's ``hf_text_config``. A mixture of experts
    counts the experts each token runs (``num_experts_per_tok`` x ``moe_intermediate_size``,
    plus a shared expert) as its MLP: the FLOPs; the weight reads of the other experts
    are left to the online fit."""
    fields = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
    experts_per_token = fields.get("num_experts_per_tok")
    moe_size = fields.get("moe_intermediate_size")
    if experts_per_token and moe_size:
        fields["intermediate_size"] = (int(experts_per_token) * int(moe_size)
                                       + int(fields.get("shared_expert_intermediate_size") or 0))
    config = transformer_config(fields, name, dtype=dtype)
    if quantization in _QUANTIZED_BYTES:
        config = TransformerConfig(**{**config.__dict__,
                                      "bytes_per_param": _QUANTIZED_BYTES[quantization]})
    return config


def parse_device(spec: str) -> Accelerator:
    """``PRESET[:field=value...]`` (``h100:bandwidth_efficiency=0.63``) -> its preset."""
    name, *overrides = spec.split(":")
    return with_overrides(ACCELERATORS[accelerator_key(name)],
                          **field_overrides(overrides, f"device {spec!r}"))


class BatchWork(NamedTuple):
    """What a step's cost is made of: tokens, attention query-key pairs, KV tokens read and
    requests (``analytic``'s quantities, from the features); per row for a matrix of
    rows, numbers for one row."""

    tokens: Any
    pairs: Any
    kv_read: Any
    requests: Any


def batch_work(rows: np.ndarray) -> BatchWork:
    """The work of each row's batch (a matrix of rows), or of one row's (numbers)."""
    return work_of(rows[..., _F["prefill_tokens"]], rows[..., _F["decode_tokens"]],
                   rows[..., _F["batch_request_count"]],
                   rows[..., _F["sum_decode_context_len"]],
                   rows[..., _F["prefill_processed_tokens"]])


def work_of(prefill: Any, decode: Any, requests: Any, decode_context: Any, processed: Any,
            maximum: Any = np.maximum) -> BatchWork:
    """The work of a batch from the feature sums. The features keep sums, not each
    sequence: a step's several prefill chunks are taken as equal (exact for one, the usual
    case), each decode as one token."""
    chunks = maximum(requests - decode, 1.0)
    pairs = (decode_context + decode + prefill * processed / chunks
             + prefill * (prefill / chunks + 1.0) / 2.0)
    return BatchWork(prefill + decode, pairs, prefill + processed + decode_context + decode,
                     requests)


@dataclass(frozen=True)
class Roofline:
    """``analytic.step_time_s`` as a few milliseconds-per-unit of a batch's work,
    computed once from the model and the accelerator: each part of a step takes the
    larger of its compute time and its memory time."""

    linear_per_token: float
    linear_weights: float
    linear_read_per_token: float
    elementwise_per_token: float
    attention_per_pair: float
    attention_per_kv_token: float
    head_per_request: float
    head_weights: float
    overhead: float

    @classmethod
    def of(cls, cfg: TransformerConfig, acc: Accelerator) -> Roofline:
        b, layers = cfg.bytes_per_param, cfg.num_layers
        params = linear_params_per_layer(cfg)
        gemm = acc.peak_flops * acc.gemm_efficiency / 1000.0  # FLOPs per ms
        attention = acc.peak_flops * acc.attention_efficiency / 1000.0
        bandwidth = acc.bandwidth * acc.bandwidth_efficiency / 1000.0  # bytes per ms
        head_params = cfg.hidden_size * cfg.vocab_size
        return cls(
            linear_per_token=2.0 * params * layers / gemm,
            linear_weights=layers * params * b / bandwidth,
            linear_read_per_token=layers * linear_activation_elements(cfg) * b / bandwidth,
            elementwise_per_token=layers * elementwise_elements(cfg) * b / bandwidth,
            attention_per_pair=4.0 * cfg.num_heads * cfg.head_dim * layers / attention,
            attention_per_kv_token=layers * 2 * cfg.num_kv_heads * cfg.head_dim * b / bandwidth,
            head_per_request=2.0 * head_params / gemm,
            head_weights=head_params * b / bandwidth,
            overhead=acc.step_overhead_s * 1000.0,
        )

    def ms(self, work: BatchWork, maximum: Any = np.maximum) -> Any:
        """The step time (ms) of the batches ``work`` describes (``maximum=max`` for one
        batch in plain numbers: a tenth of numpy's cost on scalars)."""
        tokens = work.tokens
        return (maximum(self.linear_per_token * tokens,
                        self.linear_weights + self.linear_read_per_token * tokens)
                + self.elementwise_per_token * tokens
                + maximum(self.attention_per_pair * work.pairs,
                          self.attention_per_kv_token * work.kv_read)
                + maximum(self.head_per_request * work.requests, self.head_weights)
                + self.overhead)


def roofline_ms(rows: np.ndarray, cfg: TransformerConfig, acc: Accelerator) -> np.ndarray:
    """``analytic.step_time_s`` of each row's batch, in ms, from its features alone
    (:func:`batch_work`)."""
    return Roofline.of(cfg, acc).ms(batch_work(np.asarray(rows, dtype=np.float64)))


def batch_terms(work: BatchWork) -> tuple[Any, ...]:
    """What a step's time grows with, for an accelerator with no preset (besides a
    constant): tokens (thousands), attention pairs (millions), KV tokens read
    (hundred-thousands) and requests (hundreds); scaled so that one fit handles them alike."""
    return (work.tokens / 1e3, work.pairs / 1e6, work.kv_read / 1e5, work.requests / 1e2)


@dataclass(frozen=True)
class FitParams:
    """The online fit: older steps count ``forget`` times less per step (0.98: a memory of
    about 50 steps), and the model is ready after ``warmup`` steps."""

    forget: float = 0.98
    warmup: int = 32
    ridge: float = 1e-3


class RooflineLatencyModel:
    """A ``chunk_rule.BatchLatencyModel`` with nothing to prepare (module docstring).

    Args:
        cfg: the served model's shape (None: unknown; then ``acc`` must be None too).
        acc: the accelerator's preset, or None where there is none (fitted from nothing).
        source: one line saying where the model came from, for the start-up log and the
            metrics.
    """

    def __init__(self, cfg: TransformerConfig | None, acc: Accelerator | None, source: str,
                 fit: FitParams = FitParams()) -> None:
        self.cfg = cfg
        self.acc = acc
        self._roofline = Roofline.of(cfg, acc) if acc is not None else None
        self.source = source
        self.fit = fit
        width = 2 if acc is not None else 5
        # Normal equations with a ridge towards the prior: the roofline as it is (weights
        # 0 and 1), or nothing at all without a preset.
        self._prior = np.array([0.0, 1.0]) if acc is not None else np.zeros(width)
        self._xtx = np.eye(width) * fit.ridge
        self._xty = self._prior * fit.ridge
        self.weights = self._prior.copy()
        self.steps_seen = 0
        self._signed = np.zeros(width, dtype=bool)
        self._signed[0] = True  # the constant (the offset) may take either sign
        self._ridge = fit.ridge * np.eye(width)
        self._pull = fit.ridge * self._prior

    @property
    def ready(self) -> bool:
        """Whether LPRS may plan with it: always with a preset, after ``warmup`` steps
        without one."""
        return self.acc is not None or self.steps_seen >= self.fit.warmup

    def _variable_terms(self, work: BatchWork, maximum: Any = np.maximum) -> tuple[Any, ...]:
        """The fitted terms but the constant, of batches' work or of one batch's."""
        if self._roofline is None:
            return batch_terms(work)
        return (self._roofline.ms(work, maximum),)

    def predict(self, rows: np.ndarray) -> np.ndarray:
        """Predicted step time (ms) of each row's batch, never below 0."""
        terms = self._variable_terms(batch_work(np.asarray(rows, dtype=np.float64)))
        return np.maximum(self._weighted(terms), 0.0)

    def predict_grown(self, batch: BatchStats, chunk: int, processed: int) -> float:
        """:meth:`predict` of ``batch`` grown by a prefill chunk of ``chunk`` tokens after
        ``processed`` computed ones, straight from the sums (no feature row): LPRS asks
        this of each candidate's largest chunk first, and skips its search when that batch
        is predicted within the target (the prediction grows with the chunk, so the
        search would choose the largest one)."""
        work = work_of(float(batch.prefill_tokens + chunk), float(batch.decode_tokens),
                       float(batch.batch_request_count + 1),
                       float(batch.sum_decode_context_len),
                       float(batch.prefill_processed_tokens + processed), maximum=max)
        return max(float(self._weighted(self._variable_terms(work, maximum=max))), 0.0)

    def _weighted(self, terms: tuple[Any, ...]) -> Any:
        """The fitted weights' sum of the constant and ``terms`` (arrays or numbers)."""
        weights = self.weights
        total = weights[0]
        for weight, term in zip(weights[1:], terms):
            total = total + weight * term
        return total

    def observe(self, row: np.ndarray, measured_ms: float) -> None:
        """A dispatched batch's features and its measured step time: one more step in the
        fit (a non-finite or non-positive time is ignored)."""
        if not 0.0 < measured_ms < np.inf:
            return
        x = np.array((1.0, *self._variable_terms(
            batch_work(np.asarray(row, dtype=np.float64)), maximum=max)))
        forget = self.fit.forget
        self._xtx = forget * self._xtx + np.outer(x, x)
        self._xty = forget * self._xty + x * measured_ms
        self.weights = nonnegative_solve(self._xtx + self._ridge, self._xty + self._pull,
                                         self._signed, self.weights > 0.0)
        self.steps_seen += 1

    def outside_range(self, row: np.ndarray) -> list[str]:
        """No training range: the roofline and the fit take any batch."""
        return []

    def training_range(self, feature: str) -> tuple[float, float]:
        raise KeyError(f"the built-in latency model has no training range ({feature})")

    def describe(self) -> str:
        if self.acc is None:
            return f"{self.source}; fitted online ({self.steps_seen} steps)"
        scale, offset = self.weights[1], self.weights[0]
        return f"{self.source}; online fit {scale:.2f} x roofline {offset:+.1f} ms"


def _tolerance(moment: np.ndarray) -> float:
    """How far above 0 a gradient must be for a weight held at 0 to be worth freeing."""
    return 1e-12 * (1.0 + float(np.abs(moment).max()))


def nonnegative_solve(gram: np.ndarray, moment: np.ndarray, signed: np.ndarray,
                      start: np.ndarray | None = None) -> np.ndarray:
    """The least-squares weights ``w`` minimising ``w'Gw - 2w'm`` (normal equations ``G``,
    ``m``) with ``w >= 0`` where ``signed`` is False: Lawson and Hanson's active set, on
    the normal equations (``G`` positive definite, a handful of terms). ``start``: the
    terms expected to be free of their bound (the last solution's), tried first: from one
    step to the next they rarely change, and one solve then suffices."""
    size = len(moment)

    def solved(on: np.ndarray) -> np.ndarray:
        if on.all():
            return np.linalg.solve(gram, moment)
        out = np.zeros(size)
        if on.any():
            out[on] = np.linalg.solve(gram[np.ix_(on, on)], moment[on])
        return out

    if start is not None:
        passive = start | signed
        weights = solved(passive)
        if (weights > 0.0)[passive & ~signed].all() and (passive.all() or not (
                (moment - gram @ weights)[~passive] > _tolerance(moment)).any()):
            return weights
    passive = signed.copy()
    weights = solved(passive)
    for _ in range(3 * size):
        gradient = moment - gram @ weights
        gradient[passive] = -np.inf
        best = int(np.argmax(gradient))
        if not gradient[best] > _tolerance(moment):
            break
        passive[best] = True
        while True:
            trial = solved(passive)
            blocked = passive & ~signed & (trial <= 0.0)
            if not blocked.any():
                weights = trial
                break
            step = np.min(weights[blocked] / (weights[blocked] - trial[blocked]))
            weights = weights + step * (trial - weights)
            passive &= ~(~signed & (weights <= 1e-15))
            weights[~passive] = 0.0
    return weights


def built_in_model(model_spec: str, device_spec: str, *, vllm_model_config: Any = None,
                   device_type: str = "cpu", device_name: str = "") -> RooflineLatencyModel:
    """The model for ``predictor.model`` and ``predictor.device`` ("auto": vLLM's model
    config and the detected device; otherwise a preset or config.json, and a preset with
    optional ``field=value`` overrides)."""
    if model_spec == "auto":
        try:
            if vllm_model_config is None:
                raise PresetError("vLLM gave the scheduler no model config")
            cfg = served_transformer(vllm_model_config.hf_text_config,
                                     str(vllm_model_config.dtype).removeprefix("torch."),
                                     vllm_model_config.quantization,
                                     str(vllm_model_config.model))
        except (PresetError, AttributeError, KeyError, TypeError, ValueError) as exc:
            # A config without the usual fields (OPT, GPT-2, ...) or a vLLM whose model
            # config reads otherwise must not stop the server: the model is then fitted
            # from nothing, as on an unknown device.
            return RooflineLatencyModel(
                None, None, f"no roofline ({exc}): fitted from measured steps alone")
        model_from = f"{vllm_model_config.model}'s config"
    else:
        cfg = model_config(model_spec)
        model_from = model_spec
    if device_spec == "auto":
        preset = preset_for_device(device_type, device_name)
        acc = ACCELERATORS[preset] if preset is not None else None
        device_from = (f"{acc.name} (detected: {device_name or device_type})" if acc is not None
                       else f"no preset for {device_name or device_type}")
    else:
        acc = parse_device(device_spec)
        device_from = f"{acc.name} (predictor.device {device_spec})"
    return RooflineLatencyModel(cfg, acc, f"roofline of {model_from} on {device_from}")
