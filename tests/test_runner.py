"""Joining the scheduler's trace to the client's requests (pure)."""

from __future__ import annotations

import pytest

from fairsched_plugin.experiment.run_files import case_id_of, join_trace

IDS = {"w-s0-00012", "w-s0-00012-0", "plain"}


@pytest.mark.parametrize(
    ("internal", "expected"),
    [
        ("cmpl-w-s0-00012-0-9f3a1b2c", "w-s0-00012"),
        # An all-digit random part looks like a choice index; the known ids decide.
        ("cmpl-w-s0-00012-0-12345678", "w-s0-00012"),
        ("cmpl-plain-0", "plain"),  # VLLM_DISABLE_REQUEST_ID_RANDOMIZATION
        ("cmpl-unknown-0-9f3a1b2c", None),
        ("chatcmpl-plain-0-9f3a1b2c", None),
    ],
)
def test_case_id_of(internal, expected):
    assert case_id_of(internal, IDS) == expected


def test_join_takes_first_admission_and_last_prefill_completion():
    requests = [{"id": "a"}, {"id": "b"}]
    trace = [
        {"t": 100.5, "t_done": 100.6, "admitted": ["cmpl-a-0-00000001"], "prefill_done": []},
        {"t": 100.7, "t_done": 100.8, "admitted": [], "prefill_done": ["cmpl-a-0-00000001"]},
        # a was preempted and came back: admitted again, prefilled again.
        {"t": 101.0, "t_done": 101.2, "admitted": ["cmpl-a-0-00000001"],
         "prefill_done": ["cmpl-a-0-00000001"]},
    ]
    assert join_trace(requests, trace, start_wall=100.0) == 1
    assert requests[0]["admitted_s"] == pytest.approx(0.5)
    assert requests[0]["prefill_done_s"] == pytest.approx(1.2)
    assert requests[1]["admitted_s"] is None and requests[1]["prefill_done_s"] is None


def test_sigterm_inside_a_server_block_unwinds_so_the_server_is_stopped():
    """A benchmark killed with SIGTERM must run its ``finally`` blocks (which stop the
    server) instead of dying with the server left running."""
    import os
    import signal
    import time

    from fairsched_plugin.bench.server import _sigterm_raises

    before = signal.getsignal(signal.SIGTERM)
    stopped = []
    with pytest.raises(SystemExit) as info:
        with _sigterm_raises():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises here
            finally:
                stopped.append(True)
    assert info.value.code == 128 + signal.SIGTERM
    assert stopped == [True]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_benchmark_server_outlasts_the_clients_idle_connections(monkeypatch):
    """vLLM closes idle connections after 5 s and the clients keep theirs longer: the
    benchmark's servers must not close one under a request ("Server disconnected")."""
    from fairsched_plugin.bench.server import server_env

    monkeypatch.delenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", raising=False)
    assert int(server_env()["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"]) > 60
    monkeypatch.setenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "30")
    assert server_env()["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "30"
