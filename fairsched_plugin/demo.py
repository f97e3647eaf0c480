"""``fairsched demo``: serve the tiny model with the default policy and query it.

Builds the tiny model (once), starts a real vLLM OpenAI server with
``--scheduler-cls fairsched_plugin.FairScheduler``, sends a handful of ShareGPT prompts
concurrently as streamed completions, prints each one's tokens, TTFT and end-to-end time
and the scheduler's start-up line from the server log, and stops the server. Exits 1 when
the start-up line is missing or a completion came back short.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .bench.openai_stream import stream_completion
from .bench.server import running_server
from .cli_types import positive_int
from .sharegpt import iter_conversations
from .model.tiny import DEFAULT_MODEL_DIR, build_tiny_model
from .user_files import output_dir

ACTIVE_MARKER = "fairsched: scheduler"


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser(
        "demo", help="serve the tiny model with the default policy and query it",
        description="Builds the tiny model if needed, starts a vLLM OpenAI server on it "
                    "with --scheduler-cls fairsched_plugin.FairScheduler, streams a few "
                    "ShareGPT prompts at once, prints each one's tokens, TTFT and "
                    "end-to-end time and the plugin's start-up line, and stops the server. "
                    "Exits 1 when the start-up line is missing or a completion is short.")
    demo.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR,
                      help="the tiny model's directory (built there if missing)")
    demo.add_argument("--out", type=Path, default=Path("runs/demo"),
                      help="directory for the server log")
    demo.add_argument("--requests", type=positive_int, default=8,
                      help="prompts sent at once")
    demo.add_argument("--max-tokens", type=positive_int, default=32,
                      help="tokens generated per prompt")
    demo.set_defaults(func=main)


def sharegpt_prompts(count: int) -> list[str]:
    """The first human turns of the packaged ShareGPT file, shortened for a quick demo."""
    prompts = []
    for turns in iter_conversations():
        human = next((t["value"] for t in turns if t.get("from") == "human"), "")
        if human.strip():
            prompts.append(human[:2000])
        if len(prompts) == count:
            break
    return prompts


def main(args: argparse.Namespace) -> int:
    try:
        output_dir(args.out)  # the server writes its log there
        model_dir = build_tiny_model(args.model_dir)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    prompts = sharegpt_prompts(args.requests)
    engine_args = [
        "--scheduler-cls", "fairsched_plugin.FairScheduler",
        "--max-model-len", "4096",
        "--max-num-batched-tokens", "256",
        "--dtype", "float32",
    ]
    log_path = args.out / "server.log"
    print(f"starting vLLM with fairsched on {model_dir} (log: {log_path}) ...", flush=True)
    with running_server(str(model_dir), log_path, engine_args) as server:
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            results = list(pool.map(
                stream_completion,
                itertools.repeat(server.base_url),
                itertools.repeat(server.model),
                prompts,
                itertools.repeat(args.max_tokens),
            ))
        active = [line for line in server.log_text().splitlines() if ACTIVE_MARKER in line]
    print(f"{'#':>2} {'prompt chars':>12} {'tokens':>6} {'TTFT s':>7} {'E2E s':>7}")
    for i, (prompt, result) in enumerate(zip(prompts, results)):
        print(f"{i:>2} {len(prompt):>12} {result.completion_tokens!s:>6} "
              f"{result.ttft_s:>7.3f} {result.e2e_s:>7.3f}")
    print(active[0] if active else "WARNING: no fairsched start-up line in the server log")
    return 0 if active and all(r.completion_tokens == args.max_tokens for r in results) else 1
