"""The simulator's prefix cache against a real server's: the same requests, sent one after
another to stock ``vllm serve`` on the CPU with the tiny model and a small KV cache,
find exactly as many cached prompt tokens, request by request, as in the simulator with
the same engine limits; both stay under the trace's own bound (a cache that never
evicts).

The requests are the first Mooncake conversation requests at 1/16 scale (a 512-token
named block becomes 32 tokens, the CPU build's block size: the same sharing, prompts a
CPU serves in seconds), sent as the stand-in token ids ``bench`` replays
(``experiment.stand_in_tokens``). Their answers name no blocks: the server samples its own,
so the next prompts share only the prompts. Then small agent sessions (a shared system
prompt, each step resending its session's history, one in five adding a long document),
sent as requests outside a session: their answers are not the ones the blocks name.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from fairsched_plugin.experiment import traces  # noqa: E402
from fairsched_plugin.experiment.arms import parse_arm  # noqa: E402
from fairsched_plugin.bench.replay import replay  # noqa: E402
from fairsched_plugin.bench.server import running_server  # noqa: E402
from fairsched_plugin.experiment.sessions import AgentParams, agent_sessions  # noqa: E402
from fairsched_plugin.sim.run_spec import RunSpec
from fairsched_plugin.sim.engine import simulate  # noqa: E402
from fairsched_plugin.sim.engine_settings import SimSettings  # noqa: E402
from fairsched_plugin.sim.step_models import LinearStepModel  # noqa: E402
from engine_flags import EAGER  # noqa: E402
from test_sim_prefix_cache import cached_by_oracle  # noqa: E402

pytestmark = pytest.mark.slow

BLOCK, SCALE, REQUESTS = 32, 16, 20
KV_BLOCKS = 80
"""2,560 tokens: one or two prompts fill it, so later ones evict earlier blocks."""
BUDGET, MAX_LEN, OUTPUT = 256, 2048, 4


def scaled_mooncake() -> list:
    """The first Mooncake requests whose prompt, scaled, fits the server."""
    rows = []
    for row in traces.read_trace("mooncake-conv"):
        whole = len(row.blocks) - 1
        tail = row.prompt_tokens - whole * traces.BLOCK_TOKENS
        prompt = whole * BLOCK + max(1, tail // SCALE)
        if prompt + OUTPUT <= MAX_LEN:
            rows.append(replace(row, prompt_tokens=prompt, output_tokens=OUTPUT,
                                block_tokens=BLOCK))
        if len(rows) == REQUESTS:
            break
    return traces.trace_case(rows, "mooncake-conv")


def small_agents() -> list:
    params = AgentParams(session_rate_per_s=2.0, system_tokens=512, task_tokens=(100, 400),
                         steps=(3, 8), result_tokens=(20, 150), long_miss_every=5,
                         long_result_tokens=(600, 1200), output_tokens=(OUTPUT, OUTPUT),
                         max_tokens=MAX_LEN, block_tokens=BLOCK)
    return [replace(r, session="", turn=0) for r in agent_sessions(40, params)]


def test_the_simulated_cache_hits_what_the_servers_cache_hits(tiny_model: Path,
                                                              tmp_path: Path) -> None:
    case = scaled_mooncake() + small_agents()
    args = ["--max-model-len", str(MAX_LEN), "--max-num-batched-tokens", str(BUDGET),
            "--max-num-seqs", "8", "--dtype", "float32", "--block-size", str(BLOCK),
            "--enable-prefix-caching", "--enable-prompt-tokens-details",
            "--num-gpu-blocks-override", str(KV_BLOCKS), *EAGER]
    with running_server(str(tiny_model), tmp_path / "server.log", args) as server:
        results = [replay(server.base_url, server.model, [replace(request, arrival_s=0.0)],
                          show_progress=False).requests[0]
                   for request in case]
    assert [r.error for r in results] == [None] * len(case)
    served = [r.cached_tokens for r in results]

    settings = SimSettings(max_num_batched_tokens=BUDGET, max_num_seqs=8,
                           max_model_len=MAX_LEN, block_size=BLOCK,
                           kv_cache_tokens=KV_BLOCKS * BLOCK, enable_prefix_caching=True)
    one_after_another = [replace(r, arrival_s=100.0 * i) for i, r in enumerate(case)]
    run = simulate(RunSpec(parse_arm("stock"), one_after_another,
                           LinearStepModel(base_s=0.01, per_token_s=0.0001), settings))
    simulated = [r["cached_tokens"] for r in run.run["requests"]]

    bound = cached_by_oracle(case, BLOCK)
    prompts = sum(r.prompt_tokens for r in case)
    print(f"\nprefix hits on {len(case)} requests: server {sum(served) / prompts:.1%}, "
          f"simulator {sum(simulated) / prompts:.1%}, a cache that never evicts "
          f"{sum(bound) / prompts:.1%}")
    assert simulated == served
    assert all(s <= b for s, b in zip(served, bound))
    assert 0 < sum(served) < sum(bound)  # the small cache evicted some shared blocks
