"""The routers of a simulated fleet: which engine each arriving request goes to.

Three routers, each as the deployment it stands for does it:

* ``round-robin``: a Kubernetes Service, or any balancer that ignores load.
* ``vllm-dp``: vLLM's own data-parallel load balancer (``DPLBAsyncMPClient.
  get_core_engine_for_request`` in vLLM 0.32): the lowest score of ``max(in flight from
  this client, waiting + running)`` plus, with a queue, ``waiting * 6 * max(0, KV usage -
  0.5)``, over the coordinator's snapshot of each engine's counts (published every 100 ms;
  between snapshots the client adds each request it routes to the chosen engine's waiting
  count), scanning from an index that rotates per request so ties spread.
* ``llm-d``: the Gateway API Inference Extension's endpoint picker in llm-d's default
  profile: a weighted sum of the prefix-cache scorer (3), the queue scorer (2) and the
  KV-cache utilisation scorer (2), highest total wins. The queue score is min-max
  normalised waiting count (``(max - q) / (max - min)``, 1 when all are equal); the KV
  score ``1 - usage``; the prefix score the fraction of the request's prompt blocks that
  the picker's own index of what it routed to that engine holds as a leading run (the
  scorer's approximate mode: an LRU of block names per engine, as large as the engine's
  KV cache). Requests that name no blocks score 0 on prefix everywhere. Ties go to the
  first engine from an index that rotates per request (the picker draws at random).
* ``llm-d-work``: ``llm-d`` with its queue scorer reading the plugin's
  ``fairsched:waiting_prompt_tokens`` (the prompt tokens queued, summed over classes) in
  place of the waiting count: a queue of a few long prompts is as long as many short ones.

Routers read each engine's state as of its last completed step (:class:`EngineState`):
at most one step older than the arrival, as a router reading ``/metrics`` sees it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from ..experiment.case_files import WorkloadRequest


class EngineState(NamedTuple):
    """What a router can read of one engine: vLLM's ``get_request_counts`` and
    ``get_kv_cache_usage`` (the figures its data-parallel coordinator publishes), and the
    prompt tokens of the requests not yet scheduled (the plugin's
    ``fairsched:waiting_prompt_tokens``)."""

    waiting: int
    running: int
    kv_usage: float
    waiting_prompt_tokens: int = 0


class Router(Protocol):
    """Chooses an engine per request and hears when its requests finish."""

    name: str

    def route(self, request: WorkloadRequest, now: float,
              engines: Sequence[EngineState]) -> int:
        """The index of the engine ``request`` goes to, arriving at ``now``."""

    def finished(self, engine: int, request: WorkloadRequest) -> None:
        """``request``, routed to ``engine``, finished or failed."""


class RoundRobin:
    """Engine ``k mod N`` for the ``k``-th request."""

    name = "round-robin"

    def __init__(self, num_engines: int) -> None:
        self.num_engines = num_engines
        self._next = 0

    def route(self, request: WorkloadRequest, now: float,
              engines: Sequence[EngineState]) -> int:
        chosen = self._next
        self._next = (self._next + 1) % self.num_engines
        return chosen

    def finished(self, engine: int, request: WorkloadRequest) -> None:
        pass


STATS_INTERVAL_S = 0.1
"""vLLM's data-parallel coordinator publishes the engines' counts at most this often."""


class VllmDataParallel:
    """vLLM's data-parallel load balancer, one API-server client (module docstring)."""

    name = "vllm-dp"

    def __init__(self, num_engines: int) -> None:
        self.num_engines = num_engines
        self._snapshot: list[list[float]] = [[0, 0, 0.0] for _ in range(num_engines)]
        self._snapshot_s = -float("inf")
        self._in_flight = [0] * num_engines
        self._start = 0

    def route(self, request: WorkloadRequest, now: float,
              engines: Sequence[EngineState]) -> int:
        if now >= self._snapshot_s + STATS_INTERVAL_S:
            self._snapshot = [[s.waiting, s.running, s.kv_usage] for s in engines]
            self._snapshot_s = now
        best, chosen = float("inf"), 0
        for i in range(self.num_engines):
            index = (self._start + i) % self.num_engines
            waiting, running, kv_usage = self._snapshot[index]
            score = max(self._in_flight[index], waiting + running)
            if waiting:
                score += waiting * 6.0 * max(0.0, kv_usage - 0.5)
            if score < best:
                best, chosen = score, index
        self._snapshot[chosen][0] += 1
        self._start = (self._start + 1) % self.num_engines
        self._in_flight[chosen] += 1
        return chosen

    def finished(self, engine: int, request: WorkloadRequest) -> None:
        self._in_flight[engine] -= 1


LLMD_WEIGHTS = {"prefix": 3.0, "queue": 2.0, "kv": 2.0}
"""llm-d's documented default scorer weights."""


class LlmdScorer:
    """llm-d's endpoint picker with its default scorers (module docstring)."""

    def __init__(self, num_engines: int, index_tokens: int,
                 weights: dict[str, float] | None = None, queue_by_work: bool = False) -> None:
        self.name = "llm-d-work" if queue_by_work else "llm-d"
        self.queue_by_work = queue_by_work
        """The queue scorer reads the waiting prompt tokens, not the waiting count."""
        self.num_engines = num_engines
        self.weights = dict(LLMD_WEIGHTS if weights is None else weights)
        self.index_tokens = index_tokens
        """Tokens' worth of blocks each engine's prefix index holds before it forgets the
        least recently routed."""
        self._index: list[OrderedDict[str, int]] = [OrderedDict() for _ in range(num_engines)]
        self._held = [0] * num_engines
        self._start = 0

    def route(self, request: WorkloadRequest, now: float,
              engines: Sequence[EngineState]) -> int:
        scores = self.scores(request, engines)
        best, chosen = -float("inf"), 0
        for i in range(self.num_engines):
            index = (self._start + i) % self.num_engines
            if scores[index] > best:
                best, chosen = scores[index], index
        self._start = (self._start + 1) % self.num_engines
        self._remember(chosen, prompt_blocks(request), request.block_tokens)
        return chosen

    def scores(self, request: WorkloadRequest, engines: Sequence[EngineState]) -> list[float]:
        """Each engine's weighted score for ``request`` (highest wins)."""
        queues = [s.waiting_prompt_tokens if self.queue_by_work else s.waiting
                  for s in engines]
        low, high = min(queues), max(queues)
        blocks = prompt_blocks(request)
        totals = []
        for i, state in enumerate(engines):
            queue = 1.0 if high == low else (high - queues[i]) / (high - low)
            prefix = self._leading_hits(i, blocks) / len(blocks) if blocks else 0.0
            totals.append(self.weights["prefix"] * prefix + self.weights["queue"] * queue
                          + self.weights["kv"] * (1.0 - state.kv_usage))
        return totals

    def finished(self, engine: int, request: WorkloadRequest) -> None:
        pass

    def _leading_hits(self, engine: int, blocks: Sequence[str]) -> int:
        index = self._index[engine]
        hits = 0
        for block in blocks:
            if block not in index:
                break
            hits += 1
        return hits

    def _remember(self, engine: int, blocks: Sequence[str], block_tokens: int) -> None:
        index = self._index[engine]
        for block in blocks:
            if block not in index:
                self._held[engine] += block_tokens
            index[block] = block_tokens
            index.move_to_end(block)
        while self._held[engine] > self.index_tokens and index:
            self._held[engine] -= index.popitem(last=False)[1]


def prompt_blocks(request: WorkloadRequest) -> tuple[str, ...]:
    """The names of the blocks that cover the request's prompt, the partial last one
    included (the picker hashes the prompt it sees; a session turn's later blocks name its
    answer, which the picker never sees)."""
    if not request.blocks or request.block_tokens < 1:
        return ()
    return request.blocks[:-(-request.prompt_tokens // request.block_tokens)]


ROUTERS = ("round-robin", "vllm-dp", "llm-d", "llm-d-work")


def make_router(name: str, num_engines: int, kv_cache_tokens: int) -> Router:
    """The router called ``name`` for ``num_engines`` engines of ``kv_cache_tokens`` KV
    tokens each (the size of llm-d's per-engine prefix index)."""
    if name == "round-robin":
        return RoundRobin(num_engines)
    if name == "vllm-dp":
        return VllmDataParallel(num_engines)
    if name in ("llm-d", "llm-d-work"):
        return LlmdScorer(num_engines, kv_cache_tokens, queue_by_work=name == "llm-d-work")
    raise ValueError(f"unknown router {name!r}; choose one of {', '.join(ROUTERS)}")


class Fleet(NamedTuple):
    """Engines behind a router (one of :data:`ROUTERS`; None: one engine, no router).

    With ``decode_engines``, a disaggregated fleet: ``engines`` prefill engines and
    ``decode_engines`` decode engines, each pool behind its own ``router``
    (``disagg``); ``decode_arm`` runs the decode pool (None: the arm itself)."""

    engines: int
    router: str | None = None
    decode_engines: int = 0
    decode_arm: str | None = None

    @property
    def disaggregated(self) -> bool:
        return self.decode_engines > 0

    @property
    def size(self) -> int:
        """How many engines' worth of requests the fleet gets in a suite: a pool's."""
        return max(self.engines, self.decode_engines)


DEFAULT_BANDWIDTH_GB_S = 50.0
"""A disaggregated fleet's KV link per decode engine: one 400 Gb/s RDMA NIC per GPU
(InfiniBand NDR or RoCE), what NIXL reads over between nodes (NVLink within a node is
faster)."""

FLEET_SPEC = ("1 (one engine), NxROUTER (e.g. 4xvllm-dp), or PpDd[xROUTER][:stock] "
              "(disaggregated: P prefill and D decode engines, e.g. 2p2dxllm-d; round "
              "robin unless a router is named; :stock runs stock vLLM on the decode pool)")


def parse_fleet(spec: str) -> Fleet:
    """A fleet spec (:data:`FLEET_SPEC`)."""
    if spec == "1":
        return Fleet(1)
    body, colon, decode_arm = spec.partition(":")
    pools, _, router = body.partition("x")
    bad = ValueError(f"fleet {spec!r}: expected {FLEET_SPEC}, the router one of "
                     f"{', '.join(ROUTERS)}")
    if colon and decode_arm != "stock":
        raise bad
    prefill, p, decode = pools.partition("p")
    if p and decode.endswith("d"):
        decode = decode[:-1]
        if not (prefill.isdigit() and decode.isdigit() and int(prefill) >= 1
                and int(decode) >= 1 and (not router or router in ROUTERS)):
            raise bad
        return Fleet(int(prefill), router or "round-robin", int(decode), decode_arm or None)
    if colon or not (pools.isdigit() and int(pools) >= 1 and router in ROUTERS):
        raise bad
    return Fleet(int(pools), router)
