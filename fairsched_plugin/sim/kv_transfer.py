"""The KV connector of the simulator's disaggregated pools: the scheduler side of a
NIXL-style pull, with each transfer's time from a link bandwidth and no worker.

vLLM's scheduler talks to it exactly as it talks to NIXL's scheduler connector
(``nixl/pull_scheduler.py``), through the same hooks:

* **Decode side** (``kv_consumer``). A request whose ``kv_transfer_params`` say
  ``do_remote_prefill`` matches its uncached prompt tokens remotely, loaded
  asynchronously (:meth:`get_num_new_matched_tokens`). vLLM then allocates its blocks and
  parks it in ``WAITING_FOR_REMOTE_KVS``; :meth:`update_state_after_alloc` queues the
  pull. The engine loop starts the step's pulls when the step starts (:meth:`start_pulls`:
  the engine's link moves one transfer at a time, ``tokens x KV bytes per token /
  bandwidth`` each) and reports each as ``finished_recving`` in the output of the first
  step that ends once it is done (:meth:`due`), as a worker's ``get_finished`` does; vLLM
  then promotes the request and recomputes its last prompt token to sample the first.
* **Prefill side** (``kv_producer``). A request marked ``do_remote_decode`` that
  finished at its length cap keeps its blocks until the decode side has read them
  (:meth:`request_finished` returns ``delay_free``); the driver tells this side when
  that read ends (:meth:`sent`), and the next step's output reports it as
  ``finished_sending``, which frees the blocks.

Only the scheduler role exists: the simulator has no model runner, so the worker-side
hooks refuse to run.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

CONNECTOR = "SimulatedKVTransfer"
MODULE = __name__

def prefill_params() -> dict[str, Any]:
    """What a disaggregation proxy sends the prefill engine with the request."""
    return {"do_remote_decode": True}


def decode_params() -> dict[str, Any]:
    """What the proxy sends the decode engine (a fresh dict per request: the connector
    clears its flag once the pull is queued)."""
    return {"do_remote_prefill": True}


class _Metadata(KVConnectorMetadata):
    """Nothing goes to a worker: the simulator has none."""


class SimulatedKVTransfer(KVConnectorBase_V1, SupportsHMA):
    """One engine's end of the simulated KV hand-off (see the module docstring).

    ``kv_connector_extra_config`` carries ``bandwidth_gb_s`` (the decode engine's link,
    GB/s) and ``kv_bytes_per_token`` (the model's KV for one token, all layers)."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig | None = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        if role != KVConnectorRole.SCHEDULER:
            raise RuntimeError(f"{CONNECTOR} is the simulator's scheduler-side connector; "
                               "it has no worker side")
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        self.bytes_per_s = float(extra["bandwidth_gb_s"]) * 1e9
        self.kv_bytes_per_token = int(extra["kv_bytes_per_token"])
        self.link_free_s = 0.0
        """When this engine's link finishes the transfers already started."""
        self._queued: list[tuple[str, int]] = []
        """Pulls allocated by the current ``schedule()``, not started yet."""
        self._events: list[tuple[float, int, str, str]] = []
        """(done at, order, "recv" or "send", request id), earliest first."""
        self._order = 0
        self.on_pull: Callable[[str, float, float], None] | None = None
        """Told of each pull as it starts: request id, start and end (the driver tells
        the prefill engine when its blocks are read)."""

    # ---- decode side -------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        params = request.kv_transfer_params
        if params is not None and params.get("do_remote_prefill"):
            count = request.num_prompt_tokens - num_computed_tokens
            if count > 0:
                return count, True
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        if params is not None and params.get("do_remote_prefill"):
            # As NIXL's: once queued the request never pulls again (after a preemption it
            # recomputes its prompt locally).
            params["do_remote_prefill"] = False
            if num_external_tokens > 0:
                self._queued.append((request.request_id, num_external_tokens))

    def start_pulls(self, at_s: float) -> None:
        """The step that carries this ``schedule()``'s pulls starts at ``at_s``: each
        starts once the link is free and takes its bytes over the bandwidth."""
        for req_id, tokens in self._queued:
            start = max(at_s, self.link_free_s)
            self.link_free_s = start + tokens * self.kv_bytes_per_token / self.bytes_per_s
            self._push(self.link_free_s, "recv", req_id)
            if self.on_pull is not None:
                self.on_pull(req_id, start, self.link_free_s)
        self._queued.clear()

    # ---- prefill side ------------------------------------------------------------

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        params = request.kv_transfer_params
        if (params is None or not params.get("do_remote_decode")
                or request.status != RequestStatus.FINISHED_LENGTH_CAPPED):
            return False, None
        return bool(block_ids), {"do_remote_prefill": True}

    def request_finished_all_groups(self, request: Request, block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, [b for group in block_ids for b in group])

    def sent(self, req_id: str, at_s: float) -> None:
        """The decode side finished reading ``req_id``'s blocks at ``at_s``."""
        self._push(at_s, "send", req_id)

    # ---- both --------------------------------------------------------------------

    def next_event_s(self) -> float | None:
        """When the next transfer ends (None: none under way)."""
        return self._events[0][0] if self._events else None

    def due(self, now_s: float) -> KVConnectorOutput | None:
        """The transfers ended by ``now_s``, as a worker reports them in a step's output
        (None: none)."""
        recving: set[str] = set()
        sending: set[str] = set()
        while self._events and self._events[0][0] <= now_s:
            _at, _order, kind, req_id = heapq.heappop(self._events)
            (recving if kind == "recv" else sending).add(req_id)
        if not recving and not sending:
            return None
        return KVConnectorOutput(finished_recving=recving or None,
                                 finished_sending=sending or None)

    def _push(self, at_s: float, kind: str, req_id: str) -> None:
        self._order += 1
        heapq.heappush(self._events, (at_s, self._order, kind, req_id))

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return _Metadata()

    # ---- worker side: none in a simulation ---------------------------------------

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{CONNECTOR} has no worker side")

    def wait_for_layer_load(self, layer_name: str) -> None:
        raise RuntimeError(f"{CONNECTOR} has no worker side")

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        raise RuntimeError(f"{CONNECTOR} has no worker side")

    def wait_for_save(self) -> None:
        raise RuntimeError(f"{CONNECTOR} has no worker side")
