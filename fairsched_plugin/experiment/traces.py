"""Production traces as workload cases: a CSV of arrivals and token counts, a window of
consecutive requests, compressed in time to a target rate with the burstiness kept.

A trace is a CSV with a header and one request per row, in arrival order. Two column
layouts are read (extra columns are ignored):

- Vidur's and the Azure LLM inference trace's: ``arrived_at,num_prefill_tokens,
  num_decode_tokens`` (seconds from the trace start, prompt tokens, output tokens);
- an access log of your own: ``arrival_s,prompt_tokens,output_tokens``, with the same
  meanings (the time origin does not matter: the window starts at 0).

``--trace azure-conv`` and ``--trace azure-code`` name the packaged Azure conversation and
code-completion traces
(``fairsched_plugin/data``, CC-BY; cite Splitwise, ISCA 2024).

A window of ``num_requests`` rows from row ``start`` becomes a case: arrivals shifted to
start at 0 and, with ``rate``, every gap multiplied by one factor so the window's mean rate
(``(n - 1) / span``) is ``rate`` requests/s. The relative gaps stay as recorded, so bursts
stay bursts. Requests are named ``<trace>-<row>`` (the row in the file, from 0), so the
same request keeps its name in every window and rate.

For the simulator only token counts matter and prompts stay empty; for a real server,
:func:`with_exact_prompts` writes prompts that encode to exactly the recorded counts, and
requests that name shared blocks are sent as stand-in token ids sharing those blocks.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from ..cli_types import at_least
from ..user_files import json_object, read_text
from .case_files import CaseFormatError, RecordedRequest, WorkloadRequest, mean_rate
from .pairs import cut_to_tokens, request_class
from .sessions import session_blocks

LAYOUTS: tuple[tuple[str, str, str], ...] = (
    ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    ("arrival_s", "prompt_tokens", "output_tokens"),
)
"""Accepted column layouts: arrival (s), prompt tokens, output tokens."""

PACKAGED = {"azure-conv": "azure_conv_2023.csv", "azure-code": "azure_code_2023.csv",
            "mooncake-conv": "mooncake_conversation_2025.jsonl.gz"}
"""Traces shipped in ``fairsched_plugin/data``, by the name ``--trace`` accepts."""


class TraceFormatError(CaseFormatError):
    """A trace that cannot be read; the message names the file, the row and the column."""


@dataclass(frozen=True, kw_only=True)
class TraceRow(RecordedRequest):
    """One recorded request and its row in the file (from 0): two requests share a cached
    prefix for as many leading blocks as their names agree."""

    row: int


BLOCK_TOKENS = 512
"""Tokens per named block of a JSONL trace by default (Mooncake's hash_ids name 512-token
blocks; ``--trace-block-tokens``)."""

JSONL_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "Mooncake's": (("timestamp", "input_length", "output_length", "hash_ids"), ()),
    "an own log's": (("arrival_s", "prompt_tokens", "output_tokens"),
                     ("block_hashes", "session", "turn")),
}
"""A JSONL trace's layouts: required and optional fields. Mooncake's ``timestamp`` is in
ms, an own log's ``arrival_s`` in s; ``hash_ids``/``block_hashes`` name the prompt's
blocks, one per started block; ``session`` and ``turn`` (from 1)
name a conversation's turns instead, whose prompts then repeat the previous turn's prompt
and answer."""


def resolve(trace: str | Path) -> Path:
    """A packaged trace's name, or a path."""
    name = str(trace)
    if name in PACKAGED:
        return Path(str(resources.files("fairsched_plugin.data") / PACKAGED[name]))
    path = Path(trace)
    if not path.exists():  # a directory or an unreadable file: read_trace names it
        raise TraceFormatError(f"trace {name!r}: no such file, nor a packaged trace "
                               f"({', '.join(PACKAGED)})")
    return path


def read_trace(trace: str | Path, block_tokens: int = BLOCK_TOKENS) -> list[TraceRow]:
    """Every row of a trace (CSV, or JSON Lines for a ``.jsonl`` file), validated: the
    error names the line (a CSV's header is line 1) and the column or field of the first
    bad value."""
    path = resolve(trace)
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        return _read_jsonl(path, block_tokens)
    reader = csv.DictReader(io.StringIO(read_text(path, TraceFormatError), newline=""))
    try:
        header = reader.fieldnames or []
        layout = next((cols for cols in LAYOUTS if set(cols) <= set(header)), None)
        if layout is None:
            wanted = " or ".join(",".join(cols) for cols in LAYOUTS)
            raise TraceFormatError(f"{path}: header {','.join(header) or '(empty)'!r} lacks "
                                   f"the columns {wanted}")
        arrival_col, prompt_col, output_col = layout
        rows: list[TraceRow] = []
        last = -math.inf
        for index, record in enumerate(reader):
            line = index + 2
            arrival = _number(record, arrival_col, path, line, integer=False)
            prompt = int(_number(record, prompt_col, path, line, integer=True))
            output = int(_number(record, output_col, path, line, integer=True))
            if arrival < last:
                raise TraceFormatError(f"{path}:{line}: column {arrival_col!r} {arrival:g} is "
                                       f"before the previous row's {last:g}; sort the trace "
                                       "by arrival")
            last = arrival
            rows.append(TraceRow(row=index, arrival_s=arrival, prompt_tokens=prompt,
                                 output_tokens=output))
    except csv.Error as exc:  # not a ValueError: an overlong field, say
        raise TraceFormatError(f"{path}:{reader.line_num}: not CSV ({exc})") from None
    if not rows:
        raise TraceFormatError(f"{path}: no requests")
    return rows


def _read_jsonl(path: Path, block_tokens: int) -> list[TraceRow]:
    """A JSON Lines trace in one of the :data:`JSONL_FIELDS` layouts."""
    rows: list[TraceRow] = []
    last = -math.inf
    sessions: dict[str, tuple[int, int]] = {}  # session -> (last turn, its prompt + answer)
    layout = None
    text_of_file = read_text(path, TraceFormatError, gzipped=True)
    for line, text in enumerate(io.StringIO(text_of_file), start=1):
        if not text.strip():
            continue
        where = f"{path}:{line}"
        record = json_object(text, TraceFormatError, where)
        if layout is None:
            layout = next((name for name, (required, _) in JSONL_FIELDS.items()
                           if required[0] in record), None)
            if layout is None:
                wanted = " or ".join(f"{name} {', '.join(required)}"
                                     for name, (required, _) in JSONL_FIELDS.items())
                raise TraceFormatError(f"{where}: fields {', '.join(record) or '(none)'} are "
                                       f"not a trace's: expected {wanted}")
        required, optional = JSONL_FIELDS[layout]
        missing = [key for key in required if key not in record]
        unknown = sorted(set(record) - set(required) - set(optional))
        if missing or unknown:
            raise TraceFormatError(
                f"{where}: " + "; ".join(
                    ([f"missing field(s) {', '.join(map(repr, missing))}"] if missing else [])
                    + ([f"unknown field(s) {', '.join(map(repr, unknown))}"] if unknown else []))
                + f" ({layout} layout: {', '.join(required + optional)})")
        arrival_key, prompt_key, output_key = required[:3]
        arrival = _number({arrival_key: str(record[arrival_key])}, arrival_key, path, line,
                          integer=False) / (1000.0 if layout == "Mooncake's" else 1.0)
        prompt = int(_number({prompt_key: str(record[prompt_key])}, prompt_key, path, line,
                             integer=True))
        output = int(_number({output_key: str(record[output_key])}, output_key, path, line,
                             integer=True))
        if arrival < last:
            raise TraceFormatError(f"{where}: field {arrival_key!r} {record[arrival_key]} is "
                                   "before the previous request's; sort the trace by arrival")
        last = arrival
        blocks = _blocks(record, prompt, output, block_tokens, sessions, where)
        rows.append(TraceRow(row=len(rows), arrival_s=arrival, prompt_tokens=prompt,
                             output_tokens=output, blocks=blocks,
                             block_tokens=block_tokens if blocks else 0,
                             session=str(record.get("session", "")),
                             turn=record.get("turn", 0)))
    if not rows:
        raise TraceFormatError(f"{path}: no requests")
    return rows


def _blocks(record: dict[str, object], prompt: int, output: int, block_tokens: int,
            sessions: dict[str, tuple[int, int]], where: str) -> tuple[str, ...]:
    """The names of a JSONL request's blocks: its recorded hashes, or for a session's turn
    the session's own blocks, over its prompt and answer (the next turn repeats both)."""
    hashes_key = "hash_ids" if "hash_ids" in record else "block_hashes"
    if hashes_key in record:
        if "session" in record:
            raise TraceFormatError(f"{where}: give {hashes_key!r} or 'session', not both")
        hashes = record[hashes_key]
        needed = -(-prompt // block_tokens)
        if not (isinstance(hashes, list) and all(
                isinstance(h, (int, str)) and not isinstance(h, bool) for h in hashes)):
            raise TraceFormatError(f"{where}: field {hashes_key!r} must be a list of integers "
                                   "or strings")
        if len(hashes) != needed:
            raise TraceFormatError(
                f"{where}: field {hashes_key!r} has {len(hashes)} hashes for a prompt of "
                f"{prompt} tokens: one per started block of {block_tokens} tokens, {needed}")
        return tuple(str(h) for h in hashes)
    if "session" not in record:
        if "turn" in record:
            raise TraceFormatError(f"{where}: field 'turn' needs 'session'")
        return ()
    session, turn = record["session"], record.get("turn")
    if not (isinstance(session, (str, int)) and not isinstance(session, bool) and str(session)):
        raise TraceFormatError(f"{where}: field 'session' must be a non-empty string or an "
                               f"integer, got {session!r}")
    if not (isinstance(turn, int) and not isinstance(turn, bool) and turn >= 1):
        raise TraceFormatError(f"{where}: field 'turn' must be an integer >= 1 beside "
                               f"'session', got {turn!r}")
    name = str(session)
    previous_turn, previous_tokens = sessions.get(name, (0, 0))
    if turn != previous_turn + 1:
        raise TraceFormatError(f"{where}: session {name!r} turn {turn} follows turn "
                               f"{previous_turn}: turns are numbered 1, 2, ... in arrival order")
    if prompt < previous_tokens:
        raise TraceFormatError(
            f"{where}: session {name!r} turn {turn} has a prompt of {prompt} tokens, shorter "
            f"than the previous turn's prompt and answer ({previous_tokens}), which it repeats")
    sessions[name] = (turn, prompt + output)
    return session_blocks(name, prompt + output, block_tokens)


def _number(record: dict[str, str | None], column: str, path: Path, line: int, *,
            integer: bool) -> float:
    text = (record.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (integer and (value < 1 or value != int(value))):
        expected = "an integer >= 1" if integer else "a finite number >= 0"
        raise TraceFormatError(f"{path}:{line}: {'column' if path.suffix == '.csv' else 'field'} "
                               f"{column!r} must be {expected}, got {text!r}")
    return value


def window(rows: Sequence[TraceRow], num_requests: int | None = None,
           start: int = 0) -> list[TraceRow]:
    """``num_requests`` consecutive rows from row ``start`` (all from ``start`` if None)."""
    if start < 0 or start >= len(rows):
        raise ValueError(f"--trace-start {start}: the trace has rows 0..{len(rows) - 1}")
    if num_requests is not None and num_requests < 1:
        raise ValueError(f"--num-requests {num_requests}: must be >= 1")
    end = len(rows) if num_requests is None else start + num_requests
    if end > len(rows):
        raise ValueError(f"--num-requests {num_requests} from row {start}: the trace has only "
                         f"{len(rows) - start} rows from there")
    return list(rows[start:end])


def trace_case(rows: Sequence[TraceRow], name: str, rate: float | None = None
               ) -> list[WorkloadRequest]:
    """A window as a case: arrivals from 0, compressed to ``rate`` requests/s if given (a
    window that arrives all at once has no gaps to compress and stays as it is)."""
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"--trace-rate {rate}: must be a number > 0")
    first = rows[0].arrival_s
    case = [WorkloadRequest(id=f"{name}-{row.row}", prompt="", tier=0,
                            request_class=request_class(row.prompt_tokens), category=name,
                            **{**_recorded(row), "arrival_s": row.arrival_s - first})
            for row in rows]
    if rate is None or case[-1].arrival_s <= 0:
        return case
    return at_rate(case, rate)


_RECORDED_FIELDS = tuple(f.name for f in fields(RecordedRequest))


def _recorded(row: TraceRow) -> dict[str, Any]:
    """The fields a trace row shares with a case's request."""
    return {name: getattr(row, name) for name in _RECORDED_FIELDS}


def at_rate(case: Sequence[WorkloadRequest], rate: float) -> list[WorkloadRequest]:
    """``case`` with its arrivals from 0, every gap scaled by one factor so its mean rate
    (``case_files.mean_rate``) is ``rate`` requests/s."""
    scale = mean_rate(case) / rate
    first = case[0].arrival_s
    return [replace(r, arrival_s=(r.arrival_s - first) * scale) for r in case]


def trace_name(trace: str | Path) -> str:
    """The name requests of a trace carry: the packaged name, or the file's stem."""
    return str(trace) if str(trace) in PACKAGED else Path(trace).stem


def load_trace_case(trace: str | Path, *, rate: float | None = None,
                    num_requests: int | None = None, start: int = 0) -> list[WorkloadRequest]:
    """Read ``trace`` and make the case of one window at one rate."""
    return trace_case(window(read_trace(trace), num_requests, start), trace_name(trace), rate)


_FILLER = ("the of and to in is that for it as was with be by on not he this are or his "
           "from at which but have an they you were her she there been one all we their "
           "has would when if so what no more out up into do any your time only could new "
           "them man some these then two first may like now my such make over our even "
           "most me state after also made many did must before back see through way where "
           "get much go well your years down should because each just those people how "
           "too little good very great long own under last right still never world").split()


def with_exact_prompts(requests: Sequence[WorkloadRequest], tokenizer: Tokenizer
                       ) -> list[WorkloadRequest]:
    """The same requests with prompt texts that encode to exactly their token counts
    (special tokens included, as the completions endpoint counts them). Each prompt starts
    with its request's name, so no two share a cached prefix. Requests that name their
    shared blocks keep no text: the replay sends their stand-in token ids
    (``stand_in_tokens``), which share exactly those blocks."""
    out = []
    for number, request in enumerate(requests):
        if request.blocks:
            out.append(request)
            continue
        n = request.prompt_tokens
        words = [f"{request.id}:"]
        words += [_FILLER[(number * 7 + i * 13) % len(_FILLER)] for i in range(2 * n + 8)]
        text = cut_to_tokens(tokenizer, " ".join(words), n)
        if text is None:
            raise ValueError(f"{request.id}: cannot write a prompt of exactly {n} tokens with "
                             "this tokenizer")
        out.append(replace(request, prompt=text))
    return out


# -------------------------------------------------------------------------------- CLI


def add_trace_arguments(parser: argparse.ArgumentParser,
                        case_group: argparse._MutuallyExclusiveGroup) -> None:
    """``--trace`` (beside ``--workload``/``--case``), ``--trace-rate`` and
    ``--trace-start``; ``--num-requests`` is the window's size."""
    case_group.add_argument(
        "--trace", metavar="CSV|JSONL|" + "|".join(PACKAGED),
        help="replay a production trace (CSV columns arrived_at,num_prefill_tokens,"
             "num_decode_tokens or arrival_s,prompt_tokens,output_tokens; JSONL as "
             "Mooncake's or with block hashes or sessions, docs/simulator.md); "
             "'azure-conv' and 'mooncake-conv' are packaged; with --num-requests "
             "N a window of N consecutive requests")
    parser.add_argument("--trace-rate", type=_rates, metavar="R[,R...]",
                        help="compress the trace window in time to R requests/s (its "
                             "burstiness kept); several values give one case each "
                             "(default: as recorded)")
    parser.add_argument("--trace-start", type=at_least(0), default=0, metavar="ROW",
                        help="the window's first row, counted from 0")
    parser.add_argument("--trace-block-tokens", type=at_least(1), default=BLOCK_TOKENS,
                        metavar="N", help="tokens per named block of a JSONL trace "
                        f"(hash_ids, block_hashes; default {BLOCK_TOKENS}, Mooncake's)")


def _rates(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--trace-rate {text!r}: numbers, comma-separated")
    if not rates or any(not (r > 0 and math.isfinite(r)) for r in rates) or (
            len(set(rates)) != len(rates)):
        raise argparse.ArgumentTypeError(f"--trace-rate {text!r}: distinct numbers > 0")
    return rates


def check_trace_arguments(args: argparse.Namespace) -> None:
    """``--trace-rate``/``--trace-start``/``--trace-block-tokens`` mean nothing without
    ``--trace``."""
    if getattr(args, "trace", None) is None and (
            args.trace_rate is not None or args.trace_start != 0
            or args.trace_block_tokens != BLOCK_TOKENS):
        raise ValueError("--trace-rate, --trace-start and --trace-block-tokens need --trace")


def trace_cases_from_args(args: argparse.Namespace, tokenizer: Tokenizer | None = None
                          ) -> dict[str, list[WorkloadRequest]]:
    """The window of ``--trace`` at each ``--trace-rate``, named ``TRACE@RATErps`` when
    there are several rates; with ``tokenizer``, prompts of the exact recorded lengths."""
    rows = window(read_trace(args.trace, args.trace_block_tokens), args.num_requests,
                  args.trace_start)
    name = trace_name(args.trace)
    rates: list[float | None] = list(args.trace_rate or [None])
    cases = {}
    for rate in rates:
        label = name if len(rates) == 1 else f"{name}@{rate:g}rps"
        case = trace_case(rows, name, rate)
        cases[label] = with_exact_prompts(case, tokenizer) if tokenizer is not None else case
    return cases
