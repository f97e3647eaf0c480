"""Server-sent-event parsing shared by the demo client and the replay client (pure)."""

from __future__ import annotations

from fairsched_plugin.bench.openai_stream import sse_payload, sse_payloads


def test_sse_payload_reads_data_lines_only():
    assert sse_payload(b'data: {"choices": [{"text": "hi"}]}\n') == {"choices": [{"text": "hi"}]}
    assert sse_payload(b"data: [DONE]\n") is None
    assert sse_payload(b"\n") is None
    assert sse_payload(b": keep-alive\n") is None


def test_sse_payloads_skips_everything_but_payloads():
    lines = [b'data: {"a": 1}\n', b"\n", b'data: {"b": 2}\n', b"data: [DONE]\n"]
    assert list(sse_payloads(lines)) == [{"a": 1}, {"b": 2}]
