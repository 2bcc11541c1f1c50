"""Health (`healthz`, and the `livez` and `readyz` probes), Prometheus metrics and the
OpenAPI document."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.base.metrics import family, label, process_lines
from gateway.edge.agent_series import agent_series, series_pieces
from gateway.edge.auth import Principal
from gateway.edge.http import Routes, streamed
from gateway.edge.openapi import openapi_document
from gateway.errors import storage_fault_kind
from gateway.runtime.schedules import LATE_MS
from lanes.gate import GateStatus
from store.port import StoreError

log = logging.getLogger("gateway.edge.routes.observe")


class ObserveRoutes(Routes):
    """Health, Prometheus metrics and the OpenAPI document."""

    async def healthz(self, request: Request) -> Response:
        """200 while the engine takes inputs; 503 while it stops, or while the event log
        cannot be written (``storage`` says why; reads go on)."""
        running = self.engine.running
        body: dict[str, Any] = {"status": "ok" if running else "stopping"}
        fault = self.engine.faults.current
        try:
            body["position"] = await self.log.last_position()
        except StoreError as error:
            log.warning("health check: %s", error)
            body["storage"] = "the event log cannot be read (the server's log says why)"
        if fault is not None:  # anyone may ask: the kind of fault, not paths or limits
            body["storage"] = f"the event log cannot be written: {storage_fault_kind(fault.reason)}"
            since = datetime.fromtimestamp(fault.since / 1000, UTC)
            body["storageFailingSince"] = since.isoformat()
        cluster = self.service.cluster
        if cluster is not None:  # who this is, and how much of the cluster it carries
            body["cluster"] = {"member": cluster.member, "owns": len(cluster.owned),
                               "members": len(cluster.view.members)}
        if running and "storage" in body:
            body["status"] = "degraded"
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    async def livez(self, request: Request) -> Response:
        """200 while the process serves (its event loop answers): a liveness probe, never
        failed by the state of the log or of the cluster."""
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """200 when this process is ready for traffic: the engine takes inputs, the event
        log can be read and written, every agent this process owns is loaded and (in a
        cluster) its reads of the others' agents are not behind the log; otherwise 503
        with ``reason`` saying which (a readiness probe)."""
        reasons: list[str] = []
        if not self.engine.running:
            reasons.append("the gateway is stopping")
        fault = self.engine.faults.current
        if fault is not None:
            reasons.append(f"the event log cannot be written: {storage_fault_kind(fault.reason)}")
        try:
            await self.log.last_position()
        except StoreError as error:
            log.warning("readiness check: %s", error)
            reasons.append("the event log cannot be read (the server's log says why)")
        cluster = self.service.cluster
        if cluster is not None:
            adopting = cluster.adopting
            if adopting:
                reasons.append(f"{len(adopting)} agents or gates of this process are still "
                               "being loaded")
            behind = cluster.replicas.behind_reason()
            if behind is not None:
                reasons.append(f"reads of the agents of other processes are behind the "
                               f"log: {behind}")
        if reasons:
            return JSONResponse({"status": "unready", "reason": "; ".join(reasons),
                                 "reasons": reasons}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def metrics(self, request: Request) -> Response:
        """Prometheus metrics (viewer or better). Per-agent series for at most
        `Service.metrics_max_agents` agents (`gateway.edge.agent_series`); the body is
        written a piece at a time as it is rendered."""
        principal = self._principal(request)
        principal.check_read()
        return await streamed(self._metrics_pieces(principal),
                              "text/plain; version=0.0.4")

    async def openapi(self, request: Request) -> Response:
        """The OpenAPI document of this API."""
        return JSONResponse(openapi_document())

    async def _metrics_pieces(self, principal: Principal) -> AsyncIterator[str]:
        engine = self.engine
        now = engine.clock.now_ms()
        seen = principal.visible(engine.agent_ids)
        series = await agent_series(engine, seen, now, self.service.metrics_max_agents)
        async for piece in series_pieces(series):
            yield piece
        lines = [
            *family("gateway_agents", "gauge",
                    "Agents now, by what holds them: HALTED, REDUCING, suppressed by a "
                    "budget, held until a resume (an alert on any of them needs no other "
                    "series).",
                    [f'gateway_agents{{state="{name}"}} {count}'
                     for name, count in series.counts.items()]),
            *family("gateway_requests_received_total", "counter",
                    "Requests received (its rate is the ingest rate).",
                    [f"gateway_requests_received_total {engine.requests_received}"]),
            *family("gateway_storage_fault", "gauge",
                    "1 while the event log refuses writes (requests are refused, to be sent "
                    "again; /readyz says why).",
                    [f"gateway_storage_fault {int(engine.faults.current is not None)}"]),
            *family("gateway_commit_backlog", "gauge", "Appends waiting for their commit.",
                    [f"gateway_commit_backlog {engine.backlog}"]),
            *family("gateway_log_backlog_events", "gauge",
                    "Events appended and not committed yet.",
                    [f"gateway_log_backlog_events {self.log.backlog}"]),
            *family("gateway_log_committed_events_total", "counter",
                    "Events this process committed to the log.",
                    [f"gateway_log_committed_events_total {self.log.committed_events}"]),
            *family("gateway_log_writer_busy_seconds_total", "counter",
                    "Seconds the log's writer was kept busy (committed events' rate over "
                    "this one's: what the log takes when kept busy).",
                    [f"gateway_log_writer_busy_seconds_total {self.log.busy_seconds:.6f}"]),
            *family("gateway_intake_budget_events", "gauge",
                    "Events the log commits in the intake's latency budget: feed frames past "
                    "it are answered busy.",
                    [f"gateway_intake_budget_events {self.service.intake.budget()}"]),
            *family("gateway_intake_busy_total", "counter",
                    "Frames and requests answered busy by the intake (nothing taken).",
                    [f"gateway_intake_busy_total {self.service.intake.refused}"]),
            *family("gateway_commit_latency_seconds", "histogram",
                    "From a decision to the commit that holds it.",
                    engine.commit_latency.lines("gateway_commit_latency_seconds")),
            *family("gateway_control_commit_latency_seconds", "histogram",
                    "From a control-lane decision (stop, pause, resume, cancel) to its commit.",
                    engine.control_commit_latency.lines(
                        "gateway_control_commit_latency_seconds")),
            *family("gateway_run_duration_seconds", "histogram", "Run durations.",
                    engine.runs.durations.lines("gateway_run_duration_seconds")),
        ]
        lines += [*self._connection_metrics(), *self._schedule_metrics(),
                 *self._cluster_metrics(),
                 *self._gate_metrics(now), *self._desk_metrics(now),
                 *process_lines(_version())]
        yield "\n".join(lines) + "\n"

    def _connection_metrics(self) -> list[str]:
        connections = self.service.connections
        return [
            *family("gateway_websocket_connections", "gauge",
                    "WebSocket connections open (authenticated or not).",
                    [f'gateway_websocket_connections{{endpoint="{e}"}} {n}'
                     for e, n in connections.open.items()]),
            *family("gateway_websocket_unauthenticated", "gauge",
                    "WebSocket connections waiting for their auth frame.",
                    [f"gateway_websocket_unauthenticated {connections.unauthenticated}"]),
            *family("gateway_websocket_refused_total", "counter",
                    "WebSocket handshakes answered 503: a connection cap was full.",
                    [f"gateway_websocket_refused_total {connections.refused}"]),
            *family("gateway_websocket_closed_total", "counter",
                    "WebSocket connections closed by a limit (1008).",
                    [f'gateway_websocket_closed_total{{reason="auth_timeout"}} '
                     f"{connections.auth_timeouts}",
                     f'gateway_websocket_closed_total{{reason="slow_reader"}} '
                     f"{connections.slow_readers}"]),
            *family("gateway_asyncio_tasks", "gauge",
                    "Tasks alive in the server's event loop (connections, commits, runs).",
                    [f"gateway_asyncio_tasks {len(asyncio.all_tasks())}"]),
        ]

    def _schedule_metrics(self) -> list[str]:
        scheduler = self.engine.schedules.scheduler
        return [
            *family("gateway_schedule_firings_total", "counter",
                    "Schedule firings this process submitted (runs by hand not counted).",
                    [f"gateway_schedule_firings_total {scheduler.fired}"]),
            *family("gateway_schedule_late_firings_total", "counter",
                    f"Of those, firings that went out over {LATE_MS / 1000:g} s after their "
                    "fire time (a stalled loop, a log refusing writes, a catch-up).",
                    [f"gateway_schedule_late_firings_total {scheduler.late}"]),
            *family("gateway_schedule_missed_firings_total", "counter",
                    "Fire times that never fired: passed while no process ran the schedule "
                    "(skipped by its catch-up), or passed over by a late firing.",
                    [f"gateway_schedule_missed_firings_total {scheduler.missed}"]),
        ]

    def _desk_metrics(self, now: int) -> list[str]:
        lines = self._alert_metrics()
        desk = self.engine.desk
        if desk.budgets is None:
            return lines
        status = desk.status(now)
        return [*lines,
            *family("gateway_desk_budget_used_ratio", "gauge",
                    "The desk's use of each of its token and spend budgets ([desk.budgets]): "
                    "at 1 every agent's runs are held back.",
                    [f'gateway_desk_budget_used_ratio{{budget="{row["budget"]}"}} '
                     f'{row["fraction"]}' for row in status["budgets"]]),
            *family("gateway_desk_budget_alerts_total", "counter",
                    "Desk budget alerts (a run took a budget's use across an alert_at "
                    "fraction).", [f"gateway_desk_budget_alerts_total {desk.alerts}"]),
        ]

    def _alert_metrics(self) -> list[str]:
        alerter = self.service.alerter
        if alerter is None:
            return []
        counts = alerter.metrics()
        hooks = counts["webhooks"]
        return [
            *family("gateway_alerts_total", "counter", "Alerts raised, by kind.",
                    [f'gateway_alerts_total{{kind="{k}"}} {n}'
                     for k, n in sorted(counts["raised"].items())]),
            *family("gateway_webhook_deliveries_total", "counter",
                    "Webhook POSTs of alerts, by outcome (delivered, retried, dead: a dead "
                    "letter, given up on).",
                    [f'gateway_webhook_deliveries_total{{webhook="{name}",outcome="{o}"}} {n}'
                     for name, w in hooks.items() for o, n in sorted(w["outcomes"].items())]),
            *family("gateway_webhook_dead_letters_total", "counter",
                    "Alerts a webhook never got.",
                    [f'gateway_webhook_dead_letters_total{{webhook="{name}"}} '
                     f'{w["outcomes"].get("dead", 0)}' for name, w in hooks.items()]),
            *family("gateway_webhook_queue", "gauge", "Alerts waiting for a webhook.",
                    [f'gateway_webhook_queue{{webhook="{name}"}} {w["waiting"]}'
                     for name, w in hooks.items()]),
        ]

    async def desk_budget(self, request: Request) -> Response:
        """The desk's token and spend budgets: each one's use now, and until when runs are
        held back if one is used up (viewer or better)."""
        self._principal(request).check_read()
        return JSONResponse(self.engine.desk.status(self.engine.clock.now_ms()))

    def _cluster_metrics(self) -> list[str]:
        cluster = self.service.cluster
        if cluster is None:
            return []
        return [
            *family("gateway_cluster_members", "gauge",
                    "Live processes of this log's cluster, as this one last read them.",
                    [f"gateway_cluster_members {len(cluster.view.members)}"]),
            *family("gateway_cluster_owned_streams", "gauge",
                    "Agents and provider gates this process owns now.",
                    [f"gateway_cluster_owned_streams {len(cluster.owned)}"]),
            *family("gateway_cluster_takeovers_total", "counter",
                    "Streams this process adopted (at its start, a hand-over or a failover).",
                    [f"gateway_cluster_takeovers_total {cluster.takeovers}"]),
        ]

    def _gate_metrics(self, now: int) -> list[str]:
        statuses = [(name, gate.status()) for name, gate in sorted(self.engine.gates.items())]
        if not statuses:
            return []

        def per_gate(name: str, kind: str, help_text: str,
                     get: Callable[[GateStatus], float | None]) -> list[str]:
            samples = [(n, get(v)) for n, v in statuses]
            return family(name, kind, help_text,
                          [f'{name}{{provider="{label(n)}"}} {value}'
                           for n, value in samples if value is not None])

        return [
            *per_gate("gateway_provider_window_requests", "gauge",
                      "Requests granted in the last 60 s.", lambda v: v.window_requests),
            *per_gate("gateway_provider_requests_per_minute_limit", "gauge",
                      "The requests-per-minute limit.", lambda v: v.limits.requests_per_minute),
            *per_gate("gateway_provider_input_tokens_per_minute_limit", "gauge",
                      "The input-tokens-per-minute limit.",
                      lambda v: v.limits.input_tokens_per_minute),
            *per_gate("gateway_provider_output_tokens_per_minute_limit", "gauge",
                      "The output-tokens-per-minute limit.",
                      lambda v: v.limits.output_tokens_per_minute),
            *per_gate("gateway_provider_max_concurrent_limit", "gauge",
                      "The most slots granted at once.", lambda v: v.limits.max_concurrent),
            *per_gate("gateway_provider_window_input_tokens", "gauge",
                      "Input tokens charged in the last 60 s.", lambda v: v.window_input_tokens),
            *per_gate("gateway_provider_window_output_tokens", "gauge",
                      "Output tokens charged in the last 60 s.",
                      lambda v: v.window_output_tokens),
            *per_gate("gateway_provider_in_flight", "gauge", "Slots granted and not given back.",
                      lambda v: v.in_flight),
            *per_gate("gateway_provider_waiting", "gauge", "Requests waiting for a slot.",
                      lambda v: v.waiting),
            *family("gateway_provider_wait_seconds", "histogram",
                    "From a slot's request to its grant (slots granted by this process).",
                    [line for name, gate in sorted(self.engine.gates.items())
                     for line in gate.waits.lines("gateway_provider_wait_seconds",
                                                  f'provider="{label(name)}"')]),
            *per_gate("gateway_provider_oldest_wait_seconds", "gauge",
                      "The longest current wait for a slot.",
                      lambda v: max((a.oldest_wait_ms for a in v.waiting_agents), default=0)
                      / 1000),
            *per_gate("gateway_provider_breaker_open", "gauge",
                      "Circuit breaker: 0 closed, 1 open, 0.5 half-open.",
                      lambda v: {"closed": 0, "open": 1}.get(v.breaker.value, 0.5)),
            *family("gateway_provider_breaker_state", "gauge",
                    "The circuit breaker's state, as a label (1 for the state it is in).",
                    [f'gateway_provider_breaker_state{{provider="{label(n)}",state="{s}"}} '
                     f"{int(v.breaker.value == s)}"
                     for n, v in statuses for s in ("closed", "open", "half_open")]),
            *per_gate("gateway_provider_backoff_seconds", "gauge",
                      "Time left of a running backoff.",
                      lambda v: max(0, (v.next_retry or now) - now) / 1000),
            *per_gate("gateway_provider_granted_total", "counter", "Slots granted.",
                      lambda v: v.counters.granted),
            *per_gate("gateway_provider_refused_total", "counter", "Slot requests refused.",
                      lambda v: v.counters.refused),
            *per_gate("gateway_provider_backoffs_total", "counter", "Backoffs scheduled.",
                      lambda v: v.counters.backoffs),
            *per_gate("gateway_provider_breaker_opens_total", "counter",
                      "Times the breaker opened.", lambda v: v.counters.breaker_opens),
            *per_gate("gateway_provider_spend_limits_total", "counter",
                      "Spend-limit answers.", lambda v: v.counters.spend_limits),
            *per_gate("gateway_provider_expired_total", "counter",
                      "Slots freed by their lease deadline (leaks caught).",
                      lambda v: v.counters.expired),
            *per_gate("gateway_provider_input_tokens_total", "counter",
                      "Input tokens reported by the provider.", lambda v: v.counters.input_tokens),
            *per_gate("gateway_provider_output_tokens_total", "counter",
                      "Output tokens reported by the provider.",
                      lambda v: v.counters.output_tokens),
        ]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trading-agent-gateway")
    except PackageNotFoundError:
        return "unknown"
