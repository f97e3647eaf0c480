"""Train the latency MLP (the chunked-prefill paper, section 3.2.1 item 4 and Table 7).

The network is 16 -> 128 -> 64 -> 32 -> 1 with ReLU and dropout 0.1, trained with AdamW
(lr 2e-3, weight decay 1e-3, batch 256, up to 300 epochs, early stopping on the validation
loss). Input normalisation (mean and standard deviation of the training split) is the
graph's first layer, and the output is scaled back to milliseconds by its last, so the
exported model takes raw feature rows and returns latency in ms: nothing about scaling can
drift between training and serving.

The loss is Eq. 5's bucket-weighted asymmetric Huber loss,
``L = 1/N sum_i w_i * a_i * huber_delta(y_i - yhat_i)`` with ``a_i = under_weight`` when the
model under-predicts (``yhat_i < y_i``) and 1 otherwise: under-prediction makes LPRS pack a
batch that overruns its latency budget, over-prediction only leaves some capacity unused.

This module imports torch; the scheduler never imports it.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from .dataset import Split
from .features import NUM_FEATURES


@dataclass(frozen=True)
class TrainConfig:
    hidden_sizes: tuple[int, ...] = (128, 64, 32)
    dropout: float = 0.1
    lr: float = 2e-3
    weight_decay: float = 1e-3
    batch_size: int = 256
    epochs: int = 300
    patience: int = 30
    under_weight: float = 2.0
    huber_delta_ms: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        checks = {
            "hidden_sizes": bool(self.hidden_sizes) and min(self.hidden_sizes) >= 1,
            "dropout": 0 <= self.dropout < 1,
            "lr": self.lr > 0,
            "weight_decay": self.weight_decay >= 0,
            "batch_size": self.batch_size >= 1,
            "epochs": self.epochs >= 1,
            "patience": self.patience >= 1,
            "under_weight": self.under_weight > 1,
            "huber_delta_ms": self.huber_delta_ms > 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                f"invalid training setting(s) {', '.join(f'{n}={getattr(self, n)!r}' for n in bad)}"
                " (hidden sizes >= 1, 0 <= dropout < 1, under_weight > 1, others positive)"
            )


class LatencyMLP(nn.Module):
    """Normalise, MLP, scale to ms: raw 16-feature rows in, latency (ms) out, shape (n,)."""

    def __init__(
        self,
        hidden_sizes: tuple[int, ...],
        dropout: float,
        feature_mean: np.ndarray,
        feature_std: np.ndarray,
        target_mean: float,
        target_std: float,
    ) -> None:
        super().__init__()
        self.register_buffer("feature_mean", torch.as_tensor(feature_mean, dtype=torch.float32))
        self.register_buffer("feature_std", torch.as_tensor(feature_std, dtype=torch.float32))
        self.register_buffer("target_mean", torch.tensor(target_mean, dtype=torch.float32))
        self.register_buffer("target_std", torch.tensor(target_std, dtype=torch.float32))
        layers: list[nn.Module] = []
        width = NUM_FEATURES
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = (features - self.feature_mean) / self.feature_std
        return self.net(x).squeeze(-1) * self.target_std + self.target_mean


def asymmetric_huber(
    predicted: torch.Tensor,
    measured: torch.Tensor,
    weight: torch.Tensor,
    delta: float,
    under_weight: float,
) -> torch.Tensor:
    """Eq. 5: mean of ``weight * (under_weight if under-predicted else 1) * huber``."""
    residual = measured - predicted
    huber = nn.functional.huber_loss(predicted, measured, reduction="none", delta=delta)
    side = torch.where(residual > 0, under_weight, 1.0)
    return (weight * side * huber).mean()


@dataclass
class TrainResult:
    model: LatencyMLP
    config: TrainConfig
    best_epoch: int
    epochs_run: int
    train_time_s: float
    history: list[dict[str, float]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "best_epoch": self.best_epoch,
            "epochs_run": self.epochs_run,
            "stopped_early": self.epochs_run < self.config.epochs,
            "train_time_s": round(self.train_time_s, 3),
            "best_val_loss": min(h["val_loss"] for h in self.history),
        }


def build_model(train: Split, config: TrainConfig) -> LatencyMLP:
    """An untrained model whose normalisation comes from the training split. A feature
    constant there (``bias``, or memory on a fixed KV pool) gets std 1, not a division by 0."""
    mean = train.features.astype(np.float64).mean(axis=0)
    std = train.features.astype(np.float64).std(axis=0)
    std = np.where(std > 1e-6 * np.maximum(np.abs(mean), 1.0), std, 1.0)
    target_std = float(train.latency_ms.std()) or 1.0
    return LatencyMLP(config.hidden_sizes, config.dropout, mean, std,
                      float(train.latency_ms.mean()), target_std)


def train_model(train: Split, val: Split, config: TrainConfig) -> TrainResult:
    """Train on ``train``; keep the weights of the epoch with the lowest validation loss,
    stopping once ``patience`` epochs have not improved on it."""
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    model = build_model(train, config)
    optimiser = torch.optim.AdamW(model.parameters(), lr=config.lr,
                                  weight_decay=config.weight_decay)
    x, y, w = _tensors(train)
    val_x, val_y, val_w = _tensors(val)

    def loss_of(predicted: torch.Tensor, measured: torch.Tensor, weight: torch.Tensor):
        return asymmetric_huber(predicted, measured, weight, config.huber_delta_ms,
                                config.under_weight)

    best_loss, best_epoch, best_state = float("inf"), 0, copy.deepcopy(model.state_dict())
    history: list[dict[str, float]] = []
    started = time.perf_counter()
    epoch = 0
    for epoch in range(1, config.epochs + 1):
        model.train()
        total = 0.0
        for batch in torch.randperm(len(y), generator=generator).split(config.batch_size):
            loss = loss_of(model(x[batch]), y[batch], w[batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += loss.item() * len(batch)
        model.eval()
        with torch.no_grad():
            val_loss = loss_of(model(val_x), val_y, val_w).item()
        history.append({"epoch": epoch, "train_loss": total / len(y), "val_loss": val_loss})
        if val_loss < best_loss:
            best_loss, best_epoch, best_state = val_loss, epoch, copy.deepcopy(model.state_dict())
        elif epoch - best_epoch >= config.patience:
            break
    model.load_state_dict(best_state)
    model.eval()
    return TrainResult(model, config, best_epoch, epoch, time.perf_counter() - started, history)


def predict(model: LatencyMLP, features: np.ndarray) -> np.ndarray:
    """The torch model's latency (ms) for 16-feature rows, in evaluation mode."""
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(np.ascontiguousarray(features, np.float32))).numpy()


def _tensors(split: Split) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.from_numpy(np.ascontiguousarray(split.features, np.float32)),
        torch.from_numpy(np.ascontiguousarray(split.latency_ms, np.float32)),
        torch.from_numpy(np.ascontiguousarray(split.weight, np.float32)),
    )
