"""The gateway's TOML config file, validated by pydantic; every error names its key.

```toml
[server]            # host, port, allowed_origins, max_frame_bytes
[store]             # path, synchronous
[[tokens]]          # name, token | token_env, role, agents
[[agents]]          # id, every `lanes.config.AgentConfig` field, [agents.reasoner]
[[hooks]]           # a `gateway.hooks` rule: kind = price_cross | green_candles | ...
```

Keys may be written in snake_case (the TOML custom) or camelCase (the wire's). A problem
is reported as ``key.path: what is wrong`` with TOML-style paths (``agents[0].debounce_ms``).
See ``examples/gateway.toml`` for a documented example.
"""

from __future__ import annotations

import difflib
import functools
import hmac
import os
import re
import secrets
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError

from gateway.auth import Role
from gateway.hooks import (
    HOOK_KINDS,
    AgentId,
    ConnectorDownRule,
    GreenCandlesRule,
    HookRule,
    PriceCrossRule,
)
from gateway.market import Symbol
from gateway.reasoner import Reasoner, SimulatedReasoner
from lanes.config import AgentConfig, Budgets

NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"
ORIGIN_PATTERN = r"https?://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?"


def _origin(origin: str) -> str:
    if not re.fullmatch(ORIGIN_PATTERN, origin):
        raise ValueError(
            f"{origin!r} is not an origin; write scheme://host[:port] "
            "(for example 'http://localhost:3000'), without a path or a trailing /"
        )
    return origin


Origin = Annotated[str, AfterValidator(_origin)]
"""A browser origin: ``http(s)://host[:port]``."""


class ConfigModel(BaseModel):
    """Base of the config models: snake_case or camelCase keys, unknown keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        extra="forbid",
        frozen=True,
        loc_by_alias=False,
    )


class ServerConfig(ConfigModel):
    """Where the gateway listens and which browser origins it lets in."""

    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=8_000, ge=0, le=65_535)
    """0 picks a free port."""
    allowed_origins: tuple[Origin, ...] = ()
    """Browser ``Origin`` values allowed on WebSocket and mutating HTTP requests."""
    max_frame_bytes: int = Field(default=1_048_576, ge=1_024, le=64 * 1_048_576)


class StoreConfig(ConfigModel):
    """The SQLite event log: its file (relative to the working directory) and durability."""

    path: Path = Path("gateway.db")
    synchronous: Literal["FULL", "NORMAL", "OFF"] = "FULL"


class TokenConfig(ConfigModel):
    """A bearer token: ``name`` is the principal recorded in events, never the secret.

    The secret is ``token`` itself or the environment variable named by ``token_env``
    (read when the config is loaded); exactly one of the two is set. Neither `repr` nor
    `str` nor a dump shows the secret.
    """

    name: str = Field(pattern=NAME_PATTERN)
    token: SecretStr | None = None
    token_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    role: Role
    agents: tuple[AgentId, ...] | None = Field(default=None, min_length=1)
    """The agents this token may touch; absent means all."""
    _secret: SecretStr = PrivateAttr(default=SecretStr(""))

    @field_validator("token")
    @classmethod
    def _token_not_empty(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and not token.get_secret_value():
            raise ValueError("must not be empty")
        return token

    @field_validator("token_env")
    @classmethod
    def _variable_is_set(cls, name: str | None, info: ValidationInfo) -> str | None:
        if name is not None and not _environ(info).get(name):
            raise ValueError(f"environment variable {name} is not set (or is empty)")
        return name

    @model_validator(mode="after")
    def _exactly_one_secret(self, info: ValidationInfo) -> TokenConfig:
        if self.token is not None and self.token_env is not None:
            _raise("token_env", "set either token or token_env, not both")
        if self.token is None and self.token_env is None:
            _raise("token", "missing: set token, or token_env naming an environment variable")
        if self.token is not None:
            self._secret = self.token
        else:
            assert self.token_env is not None
            self._secret = SecretStr(_environ(info)[self.token_env])
        return self

    @property
    def secret(self) -> str:
        """The secret itself (handle with care: never log it)."""
        return self._secret.get_secret_value()

    def matches(self, candidate: str) -> bool:
        """Whether ``candidate`` is this token's secret (compared in constant time)."""
        return hmac.compare_digest(candidate.encode(), self.secret.encode())

    def allows(self, agent_id: str) -> bool:
        """Whether this token's scope includes ``agent_id``."""
        return self.agents is None or agent_id in self.agents


class SimulatedReasonerConfig(ConfigModel):
    """The simulated reasoner (see `gateway.reasoner.SimulatedReasoner`)."""

    kind: Literal["simulated"] = "simulated"
    latency_ms: tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]] = (200, 1_500)
    """A run's latency is drawn uniformly from ``[low, high]``."""
    trade_probability: float = Field(default=0.3, ge=0.0, le=1.0)
    steerable: bool = True
    turns: int = Field(default=2, ge=1, le=100)
    seed: int | None = 7
    symbol: Symbol = "BTCUSD"
    """The symbol of its orders when the requests name none."""

    @field_validator("latency_ms")
    @classmethod
    def _ordered(cls, latency: tuple[int, int]) -> tuple[int, int]:
        if latency[0] > latency[1]:
            raise ValueError(f"[low, high] with low <= high; got {list(latency)}")
        return latency


# A discriminated union of one kind for now; "anthropic" and "openai" are added here.
ReasonerConfig = Annotated[SimulatedReasonerConfig, Field(discriminator="kind")]
REASONER_KINDS = frozenset({"simulated"})


class AgentEntry(ConfigModel):
    """One ``[[agents]]`` table: ``id``, every `AgentConfig` field at the same level, and
    ``reasoner`` (its ``kind`` defaults to ``simulated``). The lane policy is validated by
    `AgentConfig` itself and kept in `config`."""

    id: AgentId
    reasoner: ReasonerConfig = Field(default_factory=SimulatedReasonerConfig)
    config: AgentConfig = Field(default_factory=AgentConfig)
    """The lane policy: every key of the table other than ``id`` and ``reasoner``."""

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        if "config" in data and set(data) <= {"id", "reasoner", "config"}:
            return data  # already split (a dumped entry)
        own = {key: value for key, value in data.items() if key in ("id", "reasoner")}
        reasoner = own.get("reasoner")
        if isinstance(reasoner, Mapping) and "kind" not in reasoner:
            own["reasoner"] = {"kind": "simulated", **reasoner}
        return {**own, "config": {k: v for k, v in data.items() if k not in own}}

    def agent_config(self) -> AgentConfig:
        """The agent's lane policy."""
        return self.config


class GatewayConfig(ConfigModel):
    """The whole config file."""

    server: ServerConfig = Field(default_factory=ServerConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    tokens: tuple[TokenConfig, ...] = ()
    agents: tuple[AgentEntry, ...] = ()
    hooks: tuple[HookRule, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> GatewayConfig:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        agents: dict[str, int] = {}
        for i, entry in enumerate(self.agents):
            if entry.id in agents:
                problems.append(
                    (("agents", i, "id"), f"duplicate agent id {entry.id!r} "
                     f"(also agents[{agents[entry.id]}])")
                )
            agents.setdefault(entry.id, i)
        names: dict[str, int] = {}
        secrets_seen: dict[str, int] = {}
        for i, token in enumerate(self.tokens):
            if token.name in names:
                problems.append(
                    (("tokens", i, "name"), f"duplicate token name {token.name!r} "
                     f"(also tokens[{names[token.name]}])")
                )
            names.setdefault(token.name, i)
            key = "token" if token.token is not None else "token_env"
            if token.secret in secrets_seen:
                problems.append(
                    (("tokens", i, key), f"the same secret as tokens[{secrets_seen[token.secret]}]"
                     "; every token needs its own secret")
                )
            secrets_seen.setdefault(token.secret, i)
            for k, agent in enumerate(token.agents or ()):
                if agent not in agents:
                    problems.append((("tokens", i, "agents", k), _unknown_agent(agent)))
        rules: dict[str, int] = {}
        for i, rule in enumerate(self.hooks):
            if rule.name in rules:
                problems.append(
                    (("hooks", i, "name"), f"duplicate hook name {rule.name!r} "
                     f"(also hooks[{rules[rule.name]}])")
                )
            rules.setdefault(rule.name, i)
            for k, agent in enumerate(rule.agents):
                if agent not in agents:
                    problems.append((("hooks", i, "agents", k), _unknown_agent(agent)))
        if problems:
            raise ValidationError.from_exception_data(
                "GatewayConfig",
                [
                    InitErrorDetails(
                        type=PydanticCustomError("config_conflict", "{message}", {"message": m}),
                        loc=loc,
                        input=None,
                    )
                    for loc, m in problems
                ],
            )
        return self

    def agent(self, agent_id: str) -> AgentEntry:
        """The entry of ``agent_id`` (`KeyError` if there is none)."""
        for entry in self.agents:
            if entry.id == agent_id:
                return entry
        raise KeyError(agent_id)

    def agent_configs(self) -> dict[str, AgentConfig]:
        """Each agent's lane policy by id, in file order."""
        return {entry.id: entry.agent_config() for entry in self.agents}

    def find_token(self, candidate: str) -> TokenConfig | None:
        """The token whose secret is ``candidate`` (every token compared in constant time)."""
        found = None
        for token in self.tokens:
            if token.matches(candidate):
                found = token
        return found


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
        ServerConfig, StoreConfig, TokenConfig, SimulatedReasonerConfig, AgentEntry,
        GatewayConfig, AgentConfig, Budgets, PriceCrossRule, GreenCandlesRule,
        ConnectorDownRule,
    ]
    return sorted({name for model in models for name in model.model_fields})


def _did_you_mean(key: str) -> str:
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()
    match = difflib.get_close_matches(snake, _vocabulary(), n=1, cutoff=0.75)
    return f" (did you mean {match[0]!r}?)" if match and match[0] != snake else ""


def _environ(info: ValidationInfo) -> Mapping[str, str]:
    context = info.context if isinstance(info.context, Mapping) else {}
    env = context.get("env")
    return env if isinstance(env, Mapping) else os.environ


def _raise(field: str, message: str) -> None:
    raise ValidationError.from_exception_data(
        "TokenConfig",
        [
            InitErrorDetails(
                type=PydanticCustomError("token_secret", "{message}", {"message": message}),
                loc=(field,),
                input=None,
            )
        ],
    )


def _unknown_agent(agent: str) -> str:
    return f"unknown agent {agent!r}; add an [[agents]] table with id = {agent!r}"


# ------------------------------------------------------------------------- builders


def build_reasoner(entry: AgentEntry) -> Reasoner:
    """The reasoner an agent's config asks for."""
    config = entry.reasoner
    return SimulatedReasoner(
        latency_ms=config.latency_ms,
        trade_probability=config.trade_probability,
        steerable=config.steerable,
        turns=config.turns,
        seed=config.seed,
        symbol=config.symbol,
    )


def demo_config() -> GatewayConfig:
    """The demo's config: three agents in different modes, hooks on BTCUSD and ETHUSD,
    and one token per role with a fresh random secret."""
    data: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": 8_000},
        "store": {"path": "gateway-demo.db"},
        "tokens": [
            {"name": f"demo-{role.value}", "token": secrets.token_urlsafe(24), "role": role}
            for role in Role
        ],
        "agents": [
            {
                "id": "agent_btc_5m", "mode": "collect", "debounce_ms": 2_000, "cap": 20,
                "budgets": {"max_runs_per_hour": 60},
                "reasoner": {"latency_ms": [400, 1_500], "trade_probability": 0.4,
                             "seed": 1, "symbol": "BTCUSD"},
            },
            {
                "id": "agent_eth_1m", "mode": "followup",
                "budgets": {"max_runs_per_hour": 12, "no_trade_cooldown_ms": 10_000},
                "reasoner": {"latency_ms": [300, 1_200], "trade_probability": 0.3,
                             "seed": 2, "symbol": "ETHUSD"},
            },
            {
                "id": "agent_news", "mode": "steer-backlog",
                "halt_on_alerts": ["connector_down"],
                "reasoner": {"latency_ms": [800, 3_000], "trade_probability": 0.1,
                             "steerable": True, "turns": 3, "seed": 3},
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
