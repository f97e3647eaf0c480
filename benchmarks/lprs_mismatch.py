"""LPRS with a latency model that does not fit the engine: steps to serve a fixed workload.

vLLM's scheduler with fake model outputs, each step taking ``--step-ms`` (a sleep), a
256-token budget and a fake KV cache of 0.5 MiB, far outside the 2 GiB the CPU engine's
model (``benchmarks/results/2026-11-30-predictor-cpu/model.onnx``) was profiled with: its memory features are out of
range for every batch. Eight 500-token prompts, one output token each, FCFS, LPRS at a
30 ms target with the online bias on as by default. Arms: the token-budget rule; LPRS with
the model's training ranges stripped (unclamped, as models trained before ranges were
recorded) and with them (clamped), each with the guard off and on (its defaults).

    .venv/bin/python -m benchmarks.lprs_mismatch --model benchmarks/results/2026-11-30-predictor-cpu/model.onnx
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

import onnx

from fairsched_plugin import FairSyncScheduler
from fairsched_plugin.sim.fake_engine import (
    OfflineEngine,
    make_request,
    make_scheduler,
    write_config_only_model,
)
from fairsched_plugin.predictor.model_format import METADATA_KEY


def without_ranges(model: Path, out: Path) -> Path:
    proto = onnx.load(str(model))
    entry = next(e for e in proto.metadata_props if e.key == METADATA_KEY)
    metadata = json.loads(entry.value)
    metadata.pop("feature_ranges", None)
    entry.value = json.dumps(metadata)
    onnx.save(proto, str(out))
    return out


def serve(model_dir: Path, config: dict[str, Any], step_ms: float) -> tuple[int, int]:
    """Steps to serve the workload, and the most tokens one step scheduled."""
    scheduler = make_scheduler(FairSyncScheduler, model_dir, max_num_batched_tokens=256,
                               num_blocks=4000, async_scheduling=False,
                               additional_config={"fairsched": config})
    engine = OfflineEngine(scheduler, model_time_s=step_ms / 1000.0)
    engine.add([make_request(f"r{i}", 500, 1, arrival_time=float(i)) for i in range(8)])
    steps = engine.run_until_idle()
    return steps, max(record.output.total_num_scheduled_tokens for record in engine.steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--step-ms", type=float, default=20.0)
    args = parser.parse_args()
    logging.getLogger("vllm.fairsched").setLevel(logging.ERROR)  # the arms' own warnings
    tmp = Path(tempfile.mkdtemp())
    model_dir = write_config_only_model(tmp / "model")
    unclamped = without_ranges(args.model, tmp / "unclamped.onnx")
    print(f"8 x 500-token prompts, budget 256, fake steps of {args.step_ms:g} ms, "
          "LPRS target 30 ms\n")
    print("| arm | steps | most tokens in a step |")
    print("|---|---|---|")
    steps, most = serve(model_dir, {"policy": "fcfs"}, args.step_ms)
    print(f"| token budget | {steps} | {most} |", flush=True)
    for label, model in (("unclamped", unclamped), ("clamped", args.model)):
        for guard in (0, 16):
            config = {"policy": "fcfs", "predictor": {"path": str(model.resolve())},
                      "lprs": {"enabled": True, "target_ms": 30.0, "guard_window": guard}}
            steps, most = serve(model_dir, config, args.step_ms)
            print(f"| LPRS, {label}, guard {'on' if guard else 'off'} | {steps} | {most} |",
                  flush=True)


if __name__ == "__main__":
    main()
