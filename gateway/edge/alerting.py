"""Alerts on their way: read from the log as it is committed (and from the feed's health),
kept for the panel, and POSTed to webhooks, signed, with retries and dead letters.

One task follows the log from where it was at the start; a webhook has a bounded queue and
a worker of its own, so a target that fails, hangs or answers slowly never holds the event
loop, the control lane or another webhook: past its queue an alert is a dead letter at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any

import httpx2

from gateway.base.clock import Clock
from gateway.base.tasks import spawn
from gateway.config.alerts import AlertsConfig, WebhookConfig
from gateway.market.health import FeedHealth
from gateway.market.prices import PLAIN, PriceWords
from gateway.reads.alerts import Alert, alert_of
from store.port import LogReads

log = logging.getLogger("gateway.alerts")
RECENT = 500
"""The feed's alerts kept for the panel (the log's are read from the log)."""
FEED_CHECK_MS = 5_000
"""How often the feed's health is looked at for alerts (of the alerter's clock)."""
BACKOFF_MS = 500
"""The first retry's wait (of the alerter's clock); each next one twice the last."""
MAX_BACKOFF_MS = 30_000
"""The longest wait between two tries of one alert."""


class Webhook:
    """One webhook's queue and worker."""

    def __init__(self, config: WebhookConfig, http: httpx2.AsyncClient, clock: Clock) -> None:
        self.config = config
        self._http = http
        self._clock = clock
        self._queue: asyncio.Queue[Alert] = asyncio.Queue(config.queue)
        self.outcomes: Counter[str] = Counter()
        """Deliveries by outcome: ``delivered``, ``retried``, ``dead``."""
        self._task: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        """Alerts waiting to be sent."""
        return self._queue.qsize()

    def start(self) -> None:
        """Start its worker."""
        self._task = spawn(self._work(), f"webhook {self.config.name}")

    async def stop(self) -> None:
        """Stop its worker (what waits is dropped)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def offer(self, alert: Alert) -> None:
        """Queue ``alert`` (a dead letter at once if the queue is full)."""
        kinds = self.config.kinds
        if kinds is not None and alert.kind not in kinds:
            return
        try:
            self._queue.put_nowait(alert)
        except asyncio.QueueFull:
            self._dead(alert, "its queue is full")

    async def _work(self) -> None:
        while True:
            alert = await self._queue.get()
            await self._deliver(alert)

    async def _deliver(self, alert: Alert) -> None:
        config = self.config
        body = json.dumps(alert.json(), separators=(",", ":")).encode()
        why = ""
        for attempt in range(config.max_attempts):
            if attempt:
                self.outcomes["retried"] += 1
                await self._clock.sleep(min(MAX_BACKOFF_MS, BACKOFF_MS * 2 ** (attempt - 1)))
            stamp = str(alert.at)
            headers = {"Content-Type": "application/json", "X-Gateway-Alert-Id": alert.id,
                       "X-Gateway-Timestamp": stamp,
                       "X-Gateway-Signature": signature(config.secret, stamp, body)}
            try:
                answer = await self._http.post(config.url, content=body, headers=headers,
                                               timeout=config.timeout_ms / 1000)
            except httpx2.HTTPError as error:
                why = f"{type(error).__name__}: {error}"
                continue
            if 200 <= answer.status_code < 300:
                self.outcomes["delivered"] += 1
                return
            why = f"HTTP {answer.status_code}"
        self._dead(alert, f"{config.max_attempts} attempts failed, the last: {why}")

    def _dead(self, alert: Alert, why: str) -> None:
        self.outcomes["dead"] += 1
        log.warning("alert %s not delivered to webhook %s: %s", alert.id, self.config.name,
                    why)


def signature(secret: str, stamp: str, body: bytes) -> str:
    """The ``X-Gateway-Signature`` of a webhook POST: HMAC-SHA256 of ``<stamp>.<body>``."""
    digest = hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={digest.hexdigest()}"


class Alerter:
    """The desk's alerts: from the log and the feed, to the panel and the webhooks."""

    def __init__(self, log_reads: LogReads, feed: FeedHealth, clock: Clock,
                 config: AlertsConfig, words: PriceWords = PLAIN) -> None:
        self._log = log_reads
        self._words = words
        self._feed = feed
        self._clock = clock
        self.rules = frozenset(config.rules)
        self._http = httpx2.AsyncClient()
        self.webhooks = [Webhook(w, self._http, clock) for w in config.webhooks]
        self.raised: Counter[str] = Counter()
        """Alerts raised since the start, by kind."""
        self.recent: deque[Alert] = deque(maxlen=RECENT)
        """The feed's alerts (those of the log are read from it)."""
        self._feed_state: dict[str, str] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._seq = 0

    async def start(self) -> None:
        """Follow the log from its end now (every event committed once this returns is
        looked at), watch the feed, start the webhooks."""
        after = await self._log.last_position()
        for webhook in self.webhooks:
            webhook.start()
        self._tasks = [spawn(self._follow(after), "alerts: the log"),
                       spawn(self._watch_feed(), "alerts: the feed")]

    async def stop(self) -> None:
        """Stop following and delivering."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for webhook in self.webhooks:
            await webhook.stop()
        await self._http.aclose()

    def raise_alert(self, alert: Alert) -> None:
        """Count ``alert`` and hand it to every webhook (if its kind is raised)."""
        if alert.kind not in self.rules:
            return
        self.raised[alert.kind] += 1
        for webhook in self.webhooks:
            webhook.offer(alert)

    async def _follow(self, after: int) -> None:
        async with contextlib.aclosing(self._log.follow(after)) as records:
            async for record in records:
                alert = alert_of(record, self._words)
                if alert is not None:
                    self.raise_alert(alert)

    async def _watch_feed(self) -> None:
        while True:
            self.check_feed()
            await self._clock.sleep(FEED_CHECK_MS)

    def check_feed(self) -> list[Alert]:
        """Alerts for the feed's changes since the last look: a connector no longer up, a
        symbol gone stale (each once, until it is well again)."""
        now = self._clock.now_ms()
        view = self._feed.view(now)
        state: dict[str, str] = {}
        for c in view["connectors"]:
            state[f"connector:{c['connector']}"] = c["status"]
        for s in view["symbols"]:
            state[f"symbol:{s['symbol']}"] = "stale" if s["stale"] else "fresh"
        raised = []
        for key, value in state.items():
            if self._feed_state.get(key) == value or value in ("up", "fresh"):
                continue
            self._seq += 1
            name = key.partition(":")[2]
            kind, text = (("connector", f"connector {name} is {value}")
                          if key.startswith("connector:") else
                          ("stale_feed", f"no data for {name} for over "
                                         f"{view['staleMs'] // 1000} s"))
            alert = Alert(f"feed-{now}-{self._seq}", kind,
                          "critical" if value == "down" else "warning", now, text)
            self.recent.append(alert)
            self.raise_alert(alert)
            raised.append(alert)
        self._feed_state = state
        return raised

    def metrics(self) -> dict[str, Any]:
        """Counts for ``/metrics``."""
        return {"raised": dict(self.raised),
                "webhooks": {w.config.name: {"outcomes": dict(w.outcomes),
                                             "waiting": w.waiting} for w in self.webhooks}}


def merged(from_log: Sequence[Alert], recent: Sequence[Alert], limit: int) -> list[Alert]:
    """The log's and the feed's alerts together, newest first, at most ``limit``."""
    return sorted([*from_log, *recent], key=lambda a: a.at, reverse=True)[:limit]
