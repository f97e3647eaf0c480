"""``fairsched train`` and ``fairsched eval-predictor``: profile in, model and report out.

``train`` cleans and splits the profiled steps, trains the MLP, exports it to ONNX, loads
the exported file back through ONNX Runtime exactly as the scheduler will, and evaluates
that on the held-out test split. ``eval-predictor`` evaluates a model on any profile (for
instance one recorded later, or under other traffic). torch and onnxruntime are imported
only when a command runs, so registering the commands costs the ``fairsched`` CLI nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ..cli_types import positive_int
from ..user_files import output_dir, output_file
from .dataset import DatasetConfig, clean, prepare
from .evaluate import accuracy_metrics, markdown_table, write_evaluation
from .features import feature_matrix, feature_ranges
from .profiling import read_profile

_DEFAULTS = DatasetConfig()


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register ``train`` and ``eval-predictor``."""
    train = subparsers.add_parser(
        "train", help="train the latency predictor on profiled steps and export it to ONNX",
        description="Cleans, buckets and splits the profiled steps (train, validation, "
                    "test), trains the MLP, exports it to ONNX for predictor.path, loads "
                    "the exported file back through ONNX Runtime as the scheduler will, "
                    "and evaluates that on the held-out test split. Needs torch (it comes with "
                    "vLLM) and the 'predictor' extra (onnx, onnxruntime).")
    _add_profile_argument(train)
    train.add_argument("--out", type=Path, required=True, help="the model file (.onnx)")
    train.add_argument("--report-dir", type=Path,
                       help="training metrics and test-split evaluation (default: "
                            "<out without .onnx>_report)")
    data = train.add_argument_group("data preparation")
    data.add_argument("--bucket-width", type=int, default=_DEFAULTS.bucket_width,
                      help="scheduled tokens per bucket")
    data.add_argument("--max-bucket-ratio", type=float, default=_DEFAULTS.max_bucket_ratio,
                      help="keep at most this x the largest other bucket of the steps that "
                           "fill the token budget")
    data.add_argument("--token-budget", type=int,
                      help="the engine's max_num_batched_tokens (default: as the profile "
                           "records it, else the largest step seen)")
    _add_outlier_argument(data)
    data.add_argument("--weight-power", type=float, default=_DEFAULTS.weight_power,
                      help="sample weight = bucket count ** -this (0: unweighted)")
    data.add_argument("--seed", type=int, default=0, help="split, sampling and training seed")
    model = train.add_argument_group(
        "model and training (the chunked-prefill paper's Table 7 defaults)")
    model.add_argument("--hidden-sizes", type=_ints, default=(128, 64, 32), metavar="H1,H2,...",
                       help="the MLP's hidden layer widths")
    model.add_argument("--dropout", type=float, default=0.1, help="dropout after each hidden layer")
    model.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate")
    model.add_argument("--weight-decay", type=float, default=1e-3, help="AdamW weight decay")
    model.add_argument("--batch-size", type=int, default=256, help="training mini-batch size")
    model.add_argument("--epochs", type=int, default=300, help="at most this many epochs")
    model.add_argument("--patience", type=int, default=30,
                       help="stop after this many epochs without a better validation loss")
    model.add_argument("--under-weight", type=float, default=2.0,
                       help="loss multiplier for under-prediction (> 1)")
    model.add_argument("--huber-delta", type=float, default=1.0,
                       help="Huber transition point (ms)")
    model.add_argument("--threads", type=positive_int, default=1,
                       help="torch threads; this MLP gains nothing from more, and on a busy "
                            "machine extra threads mostly wait on each other")
    train.set_defaults(func=main_train)

    evaluate = subparsers.add_parser(
        "eval-predictor", help="evaluate a latency model (.onnx) on profiled steps",
        description="Loads a latency model through ONNX Runtime as the scheduler does and "
                    "compares its predictions with the measured step times of one or more "
                    "profiles (for instance recorded later, or under other traffic); "
                    "writes the accuracy metrics and plots to --out.")
    evaluate.add_argument("--model", type=Path, required=True,
                          help="the latency model to evaluate (.onnx, from 'fairsched train' "
                               "or 'fairsched lprs-predictor')")
    _add_profile_argument(evaluate)
    evaluate.add_argument("--out", type=Path, required=True, help="report directory")
    _add_outlier_argument(evaluate)
    evaluate.add_argument("--bucket-width", type=int, default=_DEFAULTS.bucket_width,
                          help="scheduled tokens per bucket, for the outlier rule")
    evaluate.add_argument("--allow-memory-mismatch", action="store_true",
                          help="evaluate although model and profile used other memory "
                               "providers")
    evaluate.set_defaults(func=main_eval)


def _add_profile_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", type=Path, action="append", required=True,
                        help="profile CSV written by the scheduler (repeatable)")


def _add_outlier_argument(parser: Any) -> None:
    parser.add_argument("--outlier-iqr", type=float, default=_DEFAULTS.outlier_iqr,
                        help="drop latencies above Q3 + this x IQR of their bucket (0: keep)")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def main_train(args: argparse.Namespace) -> int:
    report_dir = args.report_dir or args.out.with_name(args.out.stem + "_report")
    try:
        raw, latency, meta = read_profile(args.profile)
        dataset_config = DatasetConfig(
            bucket_width=args.bucket_width, max_bucket_ratio=args.max_bucket_ratio,
            token_budget=args.token_budget or meta.get("max_num_batched_tokens"),
            outlier_iqr=args.outlier_iqr, weight_power=args.weight_power, seed=args.seed,
        )
        data = prepare(raw, latency, dataset_config)
        # Before training, not after it: the model and the report go here.
        output_file(args.out)
        output_dir(report_dir)
        # torch and ONNX load here, once the profile and the outputs are known to be good.
        import torch

        from .export import export_onnx, model_metadata
        from .runtime import LatencyPredictor
        from .train import TrainConfig, predict, train_model

        train_config = TrainConfig(
            hidden_sizes=args.hidden_sizes, dropout=args.dropout, lr=args.lr,
            weight_decay=args.weight_decay, batch_size=args.batch_size, epochs=args.epochs,
            patience=args.patience, under_weight=args.under_weight,
            huber_delta_ms=args.huber_delta, seed=args.seed,
        )
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    print(f"samples: {data.counts}", flush=True)
    result = train_model(data.train, data.val, train_config)
    test_metrics = accuracy_metrics(data.test.latency_ms, predict(result.model, data.test.features))
    constant = float(np.median(data.train.latency_ms))
    baseline = accuracy_metrics(data.test.latency_ms, np.full(len(data.test), constant))
    training = {
        "test_metrics": test_metrics,
        "constant_baseline_test_mae_ms": baseline["mae_ms"],
        "samples": data.counts,
        "dataset": asdict(dataset_config),
        **result.summary(),
        "profile_files": meta["files"],
    }
    export_onnx(result.model, args.out, model_metadata(
        memory_provider=meta["memory_provider"], vllm_version=meta.get("vllm_version", ""),
        hardware=meta.get("hardware", ""), training=training,
        feature_ranges=feature_ranges(data.train.features),
    ))
    # Evaluate the exported file as the scheduler will load it, not the torch model.
    predictor = LatencyPredictor.load(args.out, expected_memory_provider=meta["memory_provider"])
    served = predictor.predict(data.test.features)
    (report_dir / "history.json").write_text(json.dumps(result.history) + "\n")
    metrics = write_evaluation(
        report_dir, data.test.latency_ms, served, "Latency predictor, held-out test split",
        extra={"training": training, "model": str(args.out)},
    )
    print(markdown_table(metrics, "test split (ONNX Runtime)"))
    print(f"constant predictor (train median {constant:.2f} ms): MAE {baseline['mae_ms']:.2f} ms")
    print(f"best epoch {result.best_epoch} of {result.epochs_run}, "
          f"{result.train_time_s:.1f} s training")
    print(f"model: {args.out}\nreport: {report_dir}")
    return 0


def main_eval(args: argparse.Namespace) -> int:
    from .runtime import LatencyPredictor

    try:
        raw, latency, meta = read_profile(args.profile)
        predictor = LatencyPredictor.load(
            args.model, expected_memory_provider=meta["memory_provider"],
            allow_memory_mismatch=args.allow_memory_mismatch,
        )
        config = DatasetConfig(bucket_width=args.bucket_width, outlier_iqr=args.outlier_iqr)
        kept, dropped = clean(raw, latency, config)
        if len(kept) == 0:
            raise ValueError(f"no usable samples in {', '.join(map(str, args.profile))}")
        output_dir(args.out)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    predicted = predictor.predict(feature_matrix(raw[kept]))
    metrics = write_evaluation(
        args.out, latency[kept], predicted, f"Latency predictor on {len(kept)} profiled steps",
        extra={"model": str(args.model), "profile_files": meta["files"],
               "samples": {"read": len(latency), **dropped, "evaluated": len(kept)}},
    )
    print(markdown_table(metrics, f"{args.model.name} on the profile"))
    print(f"report: {args.out}")
    return 0
