"""The gateway's TOML config file, validated by pydantic; every error names its key.

```toml
[server]            # host, port, allowed_origins, max_frame_bytes, max_connections,
                    # max_unauthenticated, auth_timeout_s, send_timeout_s,
                    # request_timeout_s, heartbeat_s, event_loop
[metrics]           # max_agents
[store]             # path, synchronous, busy_timeout_ms, max_batch
[[tokens]]          # name, token | token_env, role, agents
[[providers]]       # name, kind = anthropic | openai | simulated, model, api_key(_env),
                    # base_url, timeout_s, [providers.limits] (a `lanes.gate.events.GateLimits`)
[[agents]]          # id, every `lanes.config.AgentConfig` field, [agents.reasoner]
[[hooks]]           # a `gateway.market.hooks` rule: kind = price_cross | green_candles | ...
[market]            # tick, [[market.symbols]] (symbol, tick): each symbol's price step
```

Keys may be written in snake_case (the TOML custom) or camelCase (the wire's). A problem
is reported as ``key.path: what is wrong`` with TOML-style paths (``agents[0].debounce_ms``).
See ``examples/gateway.toml`` for a documented example. The models (one per table) are in
`gateway.config.models`; this module loads, validates and builds from them.
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
import os
import re
import secrets
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from gateway.base.roles import Role
from gateway.config.models import (
    KEY_VARIABLES,
    NAME_PATTERN,
    ORIGIN_PATTERN,
    PROVIDER_KINDS,
    REASONER_KINDS,
    RESERVED_PRINCIPALS,
    AgentEntry,
    ClusterConfig,
    ConfigModel,
    GatewayConfig,
    LLMReasonerConfig,
    MetricsConfig,
    Origin,
    Prices,
    ProviderConfig,
    ReasonerConfig,
    ServerConfig,
    SimulatedCallConfig,
    SimulatedReasonerConfig,
    StoreConfig,
    TokenConfig,
    WorkerReasonerConfig,
)
from gateway.llm.reasoner import (
    SYSTEM_PROMPT,
    LLMReasoner,
    Reasoner,
    SimulatedCall,
    SimulatedReasoner,
)
from gateway.market.hooks import (
    HOOK_KINDS,
    ConnectorDownRule,
    GreenCandlesRule,
    PriceCrossRule,
)
from gateway.runtime.workers import WorkerHub, WorkerReasoner
from lanes.config import AgentConfig, Budgets
from lanes.gate.events import GateLimits

if TYPE_CHECKING:
    from gateway.base.clock import Clock
    from gateway.llm.port import LLMClient
    from gateway.runtime.gate import ProviderGate
    from store.port import EventStore

log = logging.getLogger("gateway.config")

__all__ = [
    "KEY_VARIABLES",
    "NAME_PATTERN",
    "ORIGIN_PATTERN",
    "PROVIDER_KINDS",
    "REASONER_KINDS",
    "RESERVED_PRINCIPALS",
    "AgentEntry",
    "ClusterConfig",
    "ConfigError",
    "ConfigModel",
    "ConfigProblem",
    "GatewayConfig",
    "LLMReasonerConfig",
    "MetricsConfig",
    "Origin",
    "ProviderConfig",
    "ReasonerConfig",
    "ServerConfig",
    "SimulatedCallConfig",
    "SimulatedReasonerConfig",
    "StoreConfig",
    "TokenConfig",
    "WorkerReasonerConfig",
    "build_clients",
    "build_gates",
    "build_reasoner",
    "demo_config",
    "load_config",
    "parse_config",
    "validate_config",
]


# ------------------------------------------------------------------------ errors


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One thing wrong with a config: where (``agents[0].debounce_ms``) and what."""

    path: str
    message: str


class ConfigError(ValueError):
    """The config is not valid; ``problems`` lists each one with its key path."""

    def __init__(self, source: str, problems: Sequence[ConfigProblem]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  {p.path}: {p.message}" for p in self.problems)
        super().__init__(f"{source}: invalid config\n{lines}")


def load_config(path: str | Path, *, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read and validate the TOML config at ``path``; raise `ConfigError` on any problem.

    ``env`` resolves ``token_env`` (default: the process environment).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise ConfigError(str(path), [ConfigProblem("(file)", f"cannot read: {reason}")]) from None
    return parse_config(text, str(path), env=env)


def parse_config(
    text: str, source: str = "<config>", *, env: Mapping[str, str] | None = None
) -> GatewayConfig:
    """Validate TOML ``text``; raise `ConfigError` naming each problem's key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(source, [_syntax_problem(str(error))]) from None
    return validate_config(data, source, env=env)


def validate_config(
    data: Mapping[str, Any], source: str = "<config>", *, env: Mapping[str, str] | None = None
) -> GatewayConfig:
    """Validate an already parsed config (a dict shaped like the TOML file)."""
    context = {"env": os.environ if env is None else env}
    try:
        return GatewayConfig.model_validate(data, context=context)
    except ValidationError as error:
        # ``from None``: the pydantic error carries input values, which may be secrets.
        raise ConfigError(source, _problems(error)) from None


def _syntax_problem(message: str) -> ConfigProblem:
    found = re.search(r"\s*\(at line (\d+), column (\d+)\)", message)
    if found is None:
        return ConfigProblem("(syntax)", f"TOML syntax error: {message}")
    what = message[: found.start()] + message[found.end():]
    return ConfigProblem(
        f"line {found.group(1)}, column {found.group(2)}", f"TOML syntax error: {what}"
    )


def _problems(error: ValidationError) -> list[ConfigProblem]:
    problems = []
    for item in error.errors(include_url=False):
        loc = item["loc"]
        kind = item["type"]
        message = item["msg"].removeprefix("Value error, ")
        ctx = item.get("ctx") or {}
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            tags = REASONER_KINDS if loc[-1:] == ("reasoner",) else HOOK_KINDS
            expected = ", ".join(sorted(tags))
            loc = (*loc, "kind")
            message = (
                f"unknown kind {ctx.get('tag')!r}; expected one of {expected}"
                if kind == "union_tag_invalid" else f"missing; expected one of {expected}"
            )
        elif kind == "extra_forbidden":
            message = "unknown key; remove it" + _did_you_mean(str(loc[-1]))
        elif kind == "missing":
            message = "missing (required)"
        elif kind in ("tuple_type", "list_type"):
            message = "must be a list"
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            message = "must be a table"
        elif kind in ("enum", "literal_error") and isinstance(item.get("input"), str | int):
            message = f"{message}; got {item['input']!r}"
        problems.append(ConfigProblem(_path(loc), message))
    return problems


def _path(loc: tuple[str | int, ...]) -> str:
    """``('agents', 0, 'config', 'debounce_ms')`` -> ``agents[0].debounce_ms``."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        before = loc[i - 2] if i >= 2 else None
        in_table = i >= 2 and isinstance(loc[i - 1], int)
        if (
            (in_table and before == "hooks" and part in HOOK_KINDS)
            or (in_table and before == "agents" and part == "config")
            or (i >= 1 and loc[i - 1] == "reasoner" and part in REASONER_KINDS)
            or part == "[key]"
        ):
            continue  # a union tag or an internal level the file does not have
        out += f".{part}" if out else part
    return out or "(top level)"


@functools.cache
def _vocabulary() -> list[str]:
    models: list[type[BaseModel]] = [
        ServerConfig, MetricsConfig, StoreConfig, ClusterConfig, TokenConfig,
        SimulatedReasonerConfig,
        LLMReasonerConfig, WorkerReasonerConfig,
        ProviderConfig, GateLimits, AgentEntry, GatewayConfig, AgentConfig, Budgets,
        PriceCrossRule, GreenCandlesRule, ConnectorDownRule,
    ]
    return sorted({name for model in models for name in model.model_fields})


def _did_you_mean(key: str) -> str:
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()
    match = difflib.get_close_matches(snake, _vocabulary(), n=1, cutoff=0.75)
    return f" (did you mean {match[0]!r}?)" if match and match[0] != snake else ""


# ------------------------------------------------------------------------- builders


def build_gates(config: GatewayConfig, store: EventStore, clock: Clock) -> dict[str, ProviderGate]:
    """One provider gate per ``[[providers]]`` table (not started)."""
    from gateway.runtime.gate import ProviderGate

    return {p.name: ProviderGate(store, p.name, p.limits, clock) for p in config.providers}


def build_clients(config: GatewayConfig) -> dict[str, LLMClient]:
    """A client for each anthropic or openai provider (a simulated one needs none)."""
    real = [p for p in config.providers if p.kind != "simulated"]
    if not real:
        return {}  # the LLM SDKs take seconds to import: only when a provider needs them
    from gateway.llm.providers import build_client

    return {
        p.name: build_client(p.kind, p.model, api_key=p.secret, base_url=p.base_url,
                             timeout_s=p.timeout_s, max_tokens_param=p.max_tokens_param)
        for p in real
    }


def _kept(path: Path | None, prefix: str) -> dict[str, str]:
    """A secret per role: those kept at ``path`` if it holds them, fresh ones for the roles
    it does not hold (a role added since they were kept: then all are kept there again,
    readable by the owner only)."""
    kept: dict[str, str] = {}
    if path is not None:
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(found, dict):
                kept = {role.value: found[role.value] for role in Role
                        if isinstance(found.get(role.value), str) and found[role.value]}
        except (OSError, ValueError):
            pass
    secrets_by_role = {role.value: kept.get(role.value) or secrets.token_urlsafe(24)
                       for role in Role}
    if path is not None and len(kept) < len(secrets_by_role):
        try:
            path.touch(mode=0o600, exist_ok=True)
            path.write_text(json.dumps(secrets_by_role), encoding="utf-8")
        except OSError:
            log.warning("cannot keep the %s tokens at %s: fresh ones at each start", prefix,
                        path)
    return secrets_by_role


def build_reasoner(entry: AgentEntry, clients: Mapping[str, LLMClient] | None = None,
                   prices: Mapping[str, Prices] | None = None,
                   workers: WorkerHub | None = None) -> Reasoner:
    """The reasoner an agent's config asks for (``clients`` and ``prices`` by provider
    name; ``workers``: the hub a worker agent's runs go through)."""
    config = entry.reasoner
    if isinstance(config, WorkerReasonerConfig):
        if workers is None:
            raise ValueError(f"agent {entry.id}: a worker agent needs the gateway's workers")
        return WorkerReasoner(workers, entry.id, heartbeat_ms=config.heartbeat_ms,
                              missed_heartbeats=config.missed_heartbeats,
                              max_steps=config.max_steps)
    known = None if config.provider is None else (prices or {}).get(config.provider)
    price = None if known is None else known.cost
    if isinstance(config, LLMReasonerConfig):
        if clients is None or config.provider not in clients:
            raise ValueError(f"no client for provider {config.provider!r}")
        return LLMReasoner(clients[config.provider],
                           system_prompt=config.system_prompt or SYSTEM_PROMPT,
                           max_tokens=config.max_tokens, max_turns=config.max_turns,
                           price=price)
    return SimulatedReasoner(
        latency_ms=config.latency_ms,
        trade_probability=config.trade_probability,
        steerable=config.steerable,
        turns=config.turns,
        seed=config.seed,
        symbol=config.symbol,
        calls=[SimulatedCall(call.agent, call.count, call.priority, dict(call.payload),
                             call.timeout_ms) for call in config.calls],
        call_below_depth=config.call_below_depth,
        call_results=config.call_results,
        tool_steps=[[(call.tool, dict(call.arguments)) for call in step]
                    for step in config.tool_steps],
        price=price,
    )


def demo_config(agents: bool = True, tokens: Path | None = None) -> GatewayConfig:
    """The demo's config: three agents in different modes, hooks on BTCUSD and ETHUSD,
    and one token per role with a fresh random secret (kept in ``tokens``, if given, and
    read from there when it exists). Without ``agents``: the minimal gateway `gateway
    serve` starts with no config file (the tokens, the defaults, a ``gateway.db`` log, no
    agent)."""
    prefix = "demo" if agents else "gateway"
    secrets_by_role = _kept(tokens, prefix)
    if not agents:
        return validate_config({"tokens": [
            {"name": f"gateway-{role.value}", "token": secrets_by_role[role.value],
             "role": role} for role in Role]}, "(no config file)")
    data: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": 8_000},
        "store": {"path": "gateway-demo.db"},
        "tokens": [
            {"name": f"demo-{role.value}", "token": secrets_by_role[role.value], "role": role}
            for role in Role
        ],
        # Every run's turns share one simulated provider's limits, as real LLM calls would.
        "providers": [
            {"name": "sim-llm", "kind": "simulated",
             "limits": {"requests_per_minute": 90, "max_concurrent": 2}},
        ],
        "agents": [
            {
                "id": "agent_btc_5m", "mode": "collect", "debounce_ms": 2_000, "cap": 20,
                "budgets": {"max_runs_per_hour": 60},
                # Its runs are tool loops: a look at the market and its book, then an
                # order, which waits for a human above 5,000 of notional (the panel's
                # approvals; or POST /api/agents/agent_btc_5m/control).
                "tools": ["market_snapshot", "positions", "open_orders", "place_order"],
                "approval": {"above_notional": 5_000},
                "reasoner": {"latency_ms": [400, 1_500], "trade_probability": 0.4,
                             "seed": 1, "symbol": "BTCUSD", "provider": "sim-llm",
                             "tool_steps": [
                                 [{"tool": "market_snapshot",
                                   "arguments": {"symbol": "$symbol"}},
                                  {"tool": "positions"}],
                                 [{"tool": "place_order",  # rests: far below the market
                                   "arguments": {"symbol": "$symbol", "side": "buy",
                                                 "qty": 0.1, "orderType": "limit",
                                                 "limitPrice": 1_000}},
                                  {"tool": "place_order",  # waits for a human
                                   "arguments": {"symbol": "$symbol", "side": "buy",
                                                 "qty": 0.1}}]]},
            },
            {
                "id": "agent_eth_1m", "mode": "followup",
                # Few runs an hour: within a minute its runs are suppressed by the budget.
                "budgets": {"max_runs_per_hour": 3, "no_trade_cooldown_ms": 10_000},
                "reasoner": {"latency_ms": [300, 1_200], "trade_probability": 0.3,
                             "seed": 2, "symbol": "ETHUSD", "provider": "sim-llm"},
            },
            {
                "id": "agent_news", "mode": "steer-backlog",
                "halt_on_alerts": ["connector_down"],
                # Each of its runs asks the two market agents with its tools: the tasks
                # are scheduled, sent together, and the run waits for both answers (the
                # panel's call tree; its run history shows the steps).
                "tools": ["schedule_tasks", "execute_scheduled_tasks", "get_queue_status"],
                "reasoner": {"latency_ms": [800, 3_000], "trade_probability": 0.1,
                             "steerable": True, "turns": 3, "seed": 3,
                             "provider": "sim-llm",
                             "tool_steps": [
                                 [{"tool": "schedule_tasks", "arguments": {"tasks": [
                                     {"agentId": "agent_btc_5m",
                                      "payload": {"question": "BTC outlook?"}},
                                     {"agentId": "agent_eth_1m",
                                      "payload": {"question": "ETH outlook?"}}]}}],
                                 [{"tool": "get_queue_status"},
                                  {"tool": "execute_scheduled_tasks"}]]},
                # A scheduled audit every 40 s (one fires in the first minute), and one at
                # New York's open.
                "schedules": [
                    {"id": "desk-audit", "every_ms": 40_000,
                     "payload": {"scope": "positions and open orders"}},
                    {"id": "open-bell", "cron": "30 9 * * 1-5",
                     "timezone": "America/New_York", "catch_up": "once"},
                ],
            },
        ],
        "hooks": [
            {"kind": "green_candles", "name": "btc_two_green", "symbol": "BTCUSD",
             "interval": "1m", "count": 2, "agents": ["agent_btc_5m"]},
            {"kind": "price_cross", "name": "btc_64k", "symbol": "BTCUSD", "level": 64_000.0,
             "direction": "both", "agents": ["agent_btc_5m"]},
            {"kind": "price_cross", "name": "eth_3090_down", "symbol": "ETHUSD",
             "level": 3_098.0, "direction": "down", "agents": ["agent_eth_1m"],
             "priority": "high"},
            {"kind": "price_cross", "name": "eth_3110_up", "symbol": "ETHUSD",
             "level": 3_102.0, "direction": "up", "agents": ["agent_eth_1m"]},
            {"kind": "connector_down", "name": "any_connector_down", "connector": "*",
             "agents": ["agent_news"]},
        ],
    }
    return validate_config(data, "<demo>")
