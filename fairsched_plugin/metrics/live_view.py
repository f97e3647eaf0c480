"""``GET /fairsched``: the engines' last snapshots as JSON, for a look without Prometheus.

A ``vllm.endpoint_plugins`` entry point. vLLM loads endpoint plugins only when
``VLLM_PLUGINS`` names them, and this one answers only with ``metrics.live_view`` on
(off by default: the queue by class describes the traffic); otherwise, and on a
render-only server (no engine), it answers 404 saying why. It reads the files the
exporter reads and never reaches into the engine.
"""

from __future__ import annotations

import time
from argparse import Namespace
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import State

from ..config import load_config
from ..config import uses_fairsched
from .reading import queue_now, snapshot_age
from .snapshot import read_snapshots

if TYPE_CHECKING:
    from vllm.engine.protocol import EngineClient

PATH = "/fairsched"
HOW_TO_ENABLE = (
    'turn it on with "metrics": {"live_view": true} in the fairsched section of '
    "--additional-config (--additional-config '{\"fairsched\": {\"metrics\": "
    "{\"live_view\": true}}}') or FAIRSCHED_METRICS_LIVE_VIEW=1; vLLM loads this endpoint "
    "only when VLLM_PLUGINS names fairsched, and that one list allows every kind of vLLM "
    "plugin, so it must also name the others the launch needs (a platform's included)"
)


@dataclass(frozen=True)
class _ViewState:
    """What the route needs, set once per app by :meth:`LiveView.init_state`."""

    instance_id: str = ""
    metrics_dir: str | None = None
    off_because: str | None = None
    """Why the view answers 404; None when it is on."""


class LiveView:
    """The endpoint plugin (vLLM's ``EndpointPlugin`` protocol)."""

    name = "fairsched"
    required_tasks = None

    def attach_router(self, app: FastAPI) -> None:
        app.add_api_route(PATH, _fairsched_view, methods=["GET"])

    async def init_state(self, engine_client: EngineClient | None, state: State,
                         args: Namespace) -> None:
        state.fairsched_live_view = _view_state(engine_client, args)


def _view_state(engine_client: EngineClient | None, args: Namespace) -> _ViewState:
    if engine_client is None:
        return _ViewState(off_because="this server has no engine (render only), so there "
                                      "is no scheduler to show")
    # Not every launch the plugin is loaded for runs fairsched; its keys are then not
    # this launch's business (as at the launch check), so they are not even read.
    if not uses_fairsched(args.scheduler_cls):
        return _ViewState(off_because="this launch does not run fairsched's scheduler")
    # vLLM's CLI parses --additional-config into a dict (JSON or dotted flags).
    config = load_config(args.additional_config).metrics
    if not config.live_view:
        return _ViewState(off_because=f"the fairsched live view is off: {HOW_TO_ENABLE}")
    if not config.enabled:
        return _ViewState(off_because="metrics.enabled is false, so the engines write no "
                                      "snapshots to show; set it to true")
    return _ViewState(instance_id=engine_client.vllm_config.instance_id,
                      metrics_dir=config.dir)


def _fairsched_view(request: Request) -> JSONResponse:
    """Read-only, and synchronous so that FastAPI reads the files off the event loop."""
    view: _ViewState = request.app.state.fairsched_live_view
    if view.off_because is not None:
        return JSONResponse({"enabled": False, "error": view.off_because}, status_code=404)
    now = time.time()
    engines = [_engine(document, now)
               for document in read_snapshots(view.metrics_dir, view.instance_id)]
    return JSONResponse({"enabled": True, "engines": engines})


def _engine(document: dict[str, Any], now: float) -> dict[str, Any]:
    """One engine's view; ``counts.overdue`` is null for a policy without a guard."""
    policy = document["policy"]
    overdue = document.get("overdue")
    return {
        "engine": document["engine"],
        "model_name": document["model_name"],
        "snapshot_time": document["time"],
        "snapshot_age_s": snapshot_age(document, now),
        "policy": policy["name"],
        "description": policy["description"],
        "settings": policy["settings"],
        "queue": queue_now(document, now),
        "alpha": document.get("alpha"),
        "lprs": document.get("lprs"),
        "failures": document["failures"],
        "counts": {
            "scheduled": sum(sum(entry["counts"]) for entry in document["queue_wait"]),
            "abandoned": sum(entry["count"] for entry in document["abandoned"]),
            "reordered": document["reordered"],
            "overdue": None if overdue is None else overdue["count"],
        },
    }
