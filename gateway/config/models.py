"""The config file's pydantic models, one per table (``[server]``, ``[[agents]]``, ...),
and the validator helpers they share; `gateway.config` loads a file into them."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from gateway.base.process import EventLoop
from gateway.base.roles import Role
from gateway.config.alerts import AlertsConfig as AlertsConfig
from gateway.config.base import ConfigModel as ConfigModel
from gateway.config.market import MarketConfig as MarketConfig
from gateway.config.mcp import McpServerConfig as McpServerConfig
from gateway.config.reasoners import REASONER_KINDS as REASONER_KINDS
from gateway.config.reasoners import LLMReasonerConfig as LLMReasonerConfig
from gateway.config.reasoners import ReasonerConfig as ReasonerConfig
from gateway.config.reasoners import SimulatedCallConfig as SimulatedCallConfig
from gateway.config.reasoners import SimulatedReasonerConfig as SimulatedReasonerConfig
from gateway.config.reasoners import SimulatedToolCall as SimulatedToolCall
from gateway.config.reasoners import WorkerReasonerConfig as WorkerReasonerConfig
from gateway.errors import BadFrame
from gateway.market.hooks import AgentId, HookRule
from gateway.runtime.schedules import check as check_schedule
from lanes.config import AgentConfig, Budgets
from lanes.gate.events import GateLimits, lease_too_short
from lanes.schedules import FILE_PRINCIPAL, MAX_SCHEDULES, SCHEDULER, Schedule
from store import DEFAULT_MAX_BATCH

NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"
RESERVED_PRINCIPALS = frozenset({FILE_PRINCIPAL, SCHEDULER})
"""Principal names no token may take."""
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


class ServerConfig(ConfigModel):
    """Where the gateway listens and which browser origins it lets in."""

    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=8_000, ge=0, le=65_535)
    """0 picks a free port."""
    allowed_origins: tuple[Origin, ...] = ()
    """Browser ``Origin`` values allowed on WebSocket and mutating HTTP requests."""
    max_frame_bytes: int = Field(default=1_048_576, ge=1_024, le=64 * 1_048_576)
    max_connections: int = Field(default=1_000, ge=1, le=100_000)
    """WebSocket connections open at once; past it a handshake is answered 503 (``busy``)."""
    max_unauthenticated: int = Field(default=100, ge=1, le=100_000)
    """Of those, connections waiting for their auth frame (a token in the header, or a
    browser's in the ``bearer.`` subprotocol, is checked at once); past it a handshake
    without either is answered 503."""
    auth_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """A WebSocket connection must authenticate within this long (else 1008)."""
    send_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """A client that leaves a frame untaken this long is closed as a slow reader (1008)."""
    heartbeat_s: float = Field(default=2.0, ge=0, le=60)
    """A subscription that had nothing to send for this long gets a ``heartbeat`` frame (0:
    none), so a client can tell a quiet gateway from a frozen one."""
    intake_budget_ms: int = Field(default=50, ge=1, le=60_000)
    """Feed frames are held, then answered ``busy`` (nothing taken), while the work waiting
    for the log would take longer than this to commit, at the log's recent commit rate."""
    intake_hold_ms: int = Field(default=1_000, ge=0, le=60_000)
    """How long such a frame waits for room (its connection unread meanwhile, so TCP pushes
    back on the sender) before it is answered ``busy`` (0: at once)."""
    request_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """A connection must send a whole HTTP request (or WebSocket handshake) within this long
    of connecting or of the request's first bytes, else it is dropped."""
    shutdown_timeout_s: float = Field(default=20.0, gt=0, le=600)
    """A graceful stop (SIGTERM, SIGINT) that takes longer than this ends the process at once:
    a stop never hangs (nothing acknowledged is lost: the log has it, as after a kill)."""
    event_loop: EventLoop = "auto"
    """The event loop `gateway serve` runs on: ``auto`` (uvloop where it is installed, as on
    Linux; else asyncio's), ``uvloop``, or ``asyncio`` (to rule uvloop out when chasing a
    problem). ``--loop`` overrides it."""


class MetricsConfig(ConfigModel):
    """What ``/metrics`` exposes."""

    max_agents: int = Field(default=200, ge=0, le=1_000_000)
    """Agents with series of their own (``agent="..."``): those that need attention first
    (HALTED, held, suppressed by a budget, with a storage fault), then the deepest queues;
    every other agent's values are summed under ``agent="_other"``. A Prometheus server
    keeps every series it has seen: 10,000 agents' series would be 120,000."""


class StoreConfig(ConfigModel):
    """The SQLite event log: its file (relative to the working directory), durability, and
    how long a commit waits for a lock held by another process before it fails."""

    path: Path = Path("gateway.db")
    url: str | None = Field(default=None, pattern=r"^postgresql(\+asyncpg)?://\S+$")
    """A PostgreSQL log (``postgresql://user:password@host:port/db``) instead of the SQLite
    file at ``path``: several gateway processes may serve it together (``[cluster]``)."""
    url_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The environment variable that holds ``url`` (its password never in a file or on a
    command line)."""
    _url: str | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _url_from_env(self, info: ValidationInfo) -> StoreConfig:
        if self.url_env is None:
            return self
        if self.url is not None:
            _raise("url_env", "set either url or url_env, not both")
        value = _environ(info).get(self.url_env)
        if not value:
            _raise("url_env", f"environment variable {self.url_env} is not set (or is empty)")
        if not re.match(r"^postgresql(\+asyncpg)?://\S+$", str(value)):
            _raise("url_env", f"environment variable {self.url_env} is not a postgresql:// URL")
        self._url = value
        return self

    @property
    def where(self) -> str | None:
        """The PostgreSQL URL, from ``url`` or the variable ``url_env`` names (None: none)."""
        return self.url or self._url
    synchronous: Literal["FULL", "NORMAL", "OFF"] = "FULL"
    busy_timeout_ms: int = Field(default=5_000, ge=0, le=600_000)
    """A commit that cannot get the write lock in this time fails (clients are answered
    ``storage_failed`` and may retry); 0 fails at once."""
    max_batch: int = Field(default=DEFAULT_MAX_BATCH, ge=1, le=100_000)
    """The most events one commit takes (group commit; an append is never split). Under a
    flood an emergency stop waits for the commit in flight: smaller batches make that wait
    shorter, at some cost in throughput (see docs/performance.md)."""


class ClusterConfig(ConfigModel):
    """Several gateway processes on one PostgreSQL log (``gateway serve --db
    postgresql://...``): each agent is owned by one process at a time
    (`gateway.cluster.member`)."""

    lease_ms: int = Field(default=5_000, ge=100, le=600_000)
    """A process that has not renewed its lease for this long is taken for dead: the others
    take its agents over (renewed every fifth of it)."""
    advertise: str | None = Field(default=None, pattern=r"^https?://[^\s/]+$")
    """The URL the other processes reach this one at (default: the address it is bound to;
    set it when that is not reachable from the other hosts, 0.0.0.0 say)."""
    secret: SecretStr | None = None
    """The secret the processes authenticate each other with (``secret_env``: read from the
    environment); default: one derived from every token of this config, which all the
    processes share."""
    secret_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    _secret: SecretStr | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _read_secret(self, info: ValidationInfo) -> ClusterConfig:
        if self.secret is not None and self.secret_env is not None:
            _raise("secret_env", "set either secret or secret_env, not both")
        if self.secret_env is not None:
            value = _environ(info).get(self.secret_env) or ""
            if not value:
                _raise("secret_env", f"environment variable {self.secret_env} is not set "
                       "(or is empty)")
            self._secret = SecretStr(value)
        else:
            self._secret = self.secret
        return self

    def shared_secret(self, tokens: Sequence[TokenConfig]) -> str:
        """The secret the processes authenticate each other with."""
        if self._secret is not None:
            return self._secret.get_secret_value()
        digest = hashlib.sha256(b"gateway-cluster")
        for secret in sorted(token.secret for token in tokens):
            digest.update(b"\0" + secret.encode())
        return digest.hexdigest()


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

    @field_validator("name")
    @classmethod
    def _name_not_reserved(cls, name: str) -> str:
        if name in RESERVED_PRINCIPALS:
            raise ValueError(f"the name {name!r} is the gateway's own (it records what the "
                             "config file and the scheduler do under it); choose another")
        return name

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


PROVIDER_KINDS = ("anthropic", "openai", "simulated")
KEY_VARIABLES = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
"""Where a provider's key is read from when the config names none."""


class Prices(ConfigModel):
    """What a provider charges per million tokens, in one currency (the agents' spend
    budgets count in it)."""

    input_per_million: float = Field(ge=0, le=1_000_000)
    output_per_million: float = Field(ge=0, le=1_000_000)

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        """What that many tokens cost."""
        return round((input_tokens * self.input_per_million
                      + output_tokens * self.output_per_million) / 1_000_000, 9)


class ProviderConfig(ConfigModel):
    """One ``[[providers]]`` table: a provider and model, and the gate all its calls share.

    Its gate's events go to the stream ``provider:<name>``. The key is ``api_key`` itself
    or the variable ``api_key_env`` names (default ``ANTHROPIC_API_KEY`` /
    ``OPENAI_API_KEY``), read when the config is loaded; it is never logged or recorded.
    """

    name: str = Field(pattern=NAME_PATTERN)
    kind: Literal["anthropic", "openai", "simulated"]
    model: str = Field(default="", max_length=200)
    base_url: str | None = Field(default=None, pattern=r"^https?://\S+$")
    api_key: SecretStr | None = None
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    timeout_s: float = Field(default=60.0, gt=0, le=600)
    """One call longer than this is a timeout (the gate then backs off)."""
    max_tokens_param: Literal["max_completion_tokens", "max_tokens"] | None = None
    """``openai`` only: the field that carries an agent's ``max_tokens``. OpenAI today takes
    ``max_completion_tokens`` (the default); older OpenAI-compatible servers ``max_tokens``."""
    limits: GateLimits = Field(default_factory=GateLimits)
    prices: Prices | None = None
    """Per million tokens: each run's cost is recorded with its usage (spend budgets)."""
    _secret: SecretStr | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _key_and_model(self, info: ValidationInfo) -> ProviderConfig:
        if self.max_tokens_param is not None and self.kind != "openai":
            _raise("max_tokens_param", f"only an openai provider takes it, not {self.kind}")
        if self.kind == "simulated":
            return self
        if not self.model:
            raise ValidationError.from_exception_data("ProviderConfig", [InitErrorDetails(
                type=PydanticCustomError("provider_model", "missing: name the {kind} model",
                                         {"kind": self.kind}),
                loc=("model",), input=None)])
        if self.api_key is not None and self.api_key_env is not None:
            _raise("api_key_env", "set either api_key or api_key_env, not both")
        if self.api_key is not None:
            if not self.api_key.get_secret_value():
                _raise("api_key", "must not be empty")
            self._secret = self.api_key
            return self
        variable = self.api_key_env or KEY_VARIABLES[self.kind]
        value = _environ(info).get(variable)
        if not value:
            _raise("api_key_env", f"no API key: environment variable {variable} is not set "
                   "(or is empty); set it, or set api_key_env or api_key")
        self._secret = SecretStr(value or "")
        return self

    @property
    def secret(self) -> str | None:
        """The API key (handle with care: never log it); None for a simulated provider."""
        return None if self._secret is None else self._secret.get_secret_value()


class AgentEntry(ConfigModel):
    """One ``[[agents]]`` table: ``id``, every `AgentConfig` field at the same level, and
    ``reasoner`` (its ``kind`` defaults to ``simulated``). The lane policy is validated by
    `AgentConfig` itself and kept in `config`."""

    id: AgentId
    reasoner: ReasonerConfig = Field(default_factory=SimulatedReasonerConfig)
    config: AgentConfig = Field(default_factory=AgentConfig)
    """The lane policy: every key of the table other than ``id``, ``reasoner`` and
    ``schedules``."""
    schedules: tuple[Schedule, ...] = Field(default=(), max_length=MAX_SCHEDULES)
    """``[[agents.schedules]]``: scheduled audits (`gateway.runtime.schedules`)."""
    mcp: tuple[McpServerConfig, ...] = Field(default=(), max_length=20)
    """``[[agents.mcp]]``: MCP servers whose tools its model is offered."""

    @field_validator("mcp")
    @classmethod
    def _mcp_names(cls, servers: tuple[McpServerConfig, ...]) -> tuple[McpServerConfig, ...]:
        names = [server.name for server in servers]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"MCP server names must be unique; repeated: {', '.join(repeated)}")
        return servers

    @field_validator("schedules")
    @classmethod
    def _schedules_valid(cls, schedules: tuple[Schedule, ...]) -> tuple[Schedule, ...]:
        ids = [schedule.id for schedule in schedules]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(f"schedule ids must be unique; repeated: {', '.join(repeated)}")
        for schedule in schedules:
            try:
                check_schedule(schedule)
            except BadFrame as error:
                raise ValueError(f"schedule {schedule.id!r}: {error}") from None
        return schedules

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        if "config" in data and set(data) <= {"id", "reasoner", "config", "schedules", "mcp"}:
            return data  # already split (a dumped entry)
        own = {key: value for key, value in data.items()
               if key in ("id", "reasoner", "schedules", "mcp")}
        reasoner = own.get("reasoner")
        if isinstance(reasoner, Mapping) and "kind" not in reasoner:
            own["reasoner"] = {"kind": "simulated", **reasoner}
        return {**own, "config": {k: v for k, v in data.items() if k not in own}}

    def agent_config(self) -> AgentConfig:
        """The agent's lane policy (with its MCP servers' tools, qualified)."""
        if not self.mcp:
            return self.config
        return self.config.model_copy(update={"mcp_tools": tuple(
            name for server in self.mcp for name in server.qualified())})


class DeskBudgets(ConfigModel):
    """Token and spend budgets for every agent together (``[desk.budgets]``): the same
    fields as an agent's, over the runs of all the agents this process decides for."""

    max_input_tokens_per_hour: int | None = Field(default=None, ge=1, le=10**15)
    max_input_tokens_per_day: int | None = Field(default=None, ge=1, le=10**15)
    max_output_tokens_per_hour: int | None = Field(default=None, ge=1, le=10**15)
    max_output_tokens_per_day: int | None = Field(default=None, ge=1, le=10**15)
    max_spend_per_hour: float | None = Field(default=None, gt=0)
    max_spend_per_day: float | None = Field(default=None, gt=0)
    alert_at: tuple[float, ...] = Field(default=(0.8, 0.95), max_length=10)

    @field_validator("alert_at")
    @classmethod
    def _fractions(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0 < f < 1 for f in value):
            raise ValueError("each alert fraction is between 0 and 1 (exclusive)")
        return value

    def budgets(self) -> Budgets:
        """As the lanes' `Budgets` (what `lanes.spending` counts with)."""
        return Budgets.model_validate(self.model_dump())


class DeskConfig(ConfigModel):
    """The desk: every agent together."""

    budgets: DeskBudgets | None = None


class GatewayConfig(ConfigModel):
    """The whole config file."""

    server: ServerConfig = Field(default_factory=ServerConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    tokens: tuple[TokenConfig, ...] = ()
    providers: tuple[ProviderConfig, ...] = ()
    agents: tuple[AgentEntry, ...] = ()
    hooks: tuple[HookRule, ...] = ()
    desk: DeskConfig = Field(default_factory=DeskConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    market: MarketConfig = Field(default_factory=MarketConfig)

    @model_validator(mode="after")
    def _consistent(self) -> GatewayConfig:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        agents = _first_of_each("agents", "id", "agent id",
                                [e.id for e in self.agents], problems)
        _first_of_each("tokens", "name", "token name", [t.name for t in self.tokens], problems)
        secrets_seen: dict[str, int] = {}
        for i, token in enumerate(self.tokens):
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
        providers = _first_of_each("providers", "name", "provider name",
                                   [p.name for p in self.providers], problems)
        for i, entry in enumerate(self.agents):
            if isinstance(entry.reasoner, SimulatedReasonerConfig):
                for k, call in enumerate(entry.reasoner.calls):
                    if call.agent not in agents:
                        problems.append((("agents", i, "reasoner", "calls", k, "agent"),
                                         _unknown_agent(call.agent)))
        for i, entry in enumerate(self.agents):
            name = entry.reasoner.provider
            if name is None:
                continue
            where = ("agents", i, "reasoner", "provider")
            if name not in providers:
                problems.append((where, f"unknown provider {name!r}; add a [[providers]] "
                                 f"table with name = {name!r}"))
                continue
            j = providers[name]
            provider = self.providers[j]
            if entry.reasoner.kind == "llm" and provider.kind == "simulated":
                problems.append((where, f"provider {name!r} is simulated: an llm reasoner "
                                 "needs an anthropic or openai provider"))
            if entry.reasoner.kind == "simulated" and provider.kind != "simulated":
                problems.append((where, f"provider {name!r} is a real one: a simulated "
                                 "reasoner's made-up answers would mislead its gate (breaker, "
                                 "usage); give it a provider of kind 'simulated'"))
            out_limit = provider.limits.output_tokens_per_minute
            if isinstance(entry.reasoner, LLMReasonerConfig) and out_limit is not None \
                    and entry.reasoner.max_tokens > out_limit:
                problems.append((("agents", i, "reasoner", "max_tokens"),
                                 f"{entry.reasoner.max_tokens} is over provider {name!r}'s "
                                 f"output_tokens_per_minute ({out_limit}): no call could ever "
                                 "be granted"))
            short = lease_too_short(provider.limits.lease_ms, entry.config.run_timeout_ms,
                                    entry.id, name)
            if short is not None:
                problems.append((("providers", j, "limits", "lease_ms"), short))
        _first_of_each("hooks", "name", "hook name", [r.name for r in self.hooks], problems)
        for i, rule in enumerate(self.hooks):
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

    def agent_gates(self) -> dict[str, str]:
        """The provider gate each agent's calls go through, for agents that have one."""
        return {entry.id: entry.reasoner.provider for entry in self.agents
                if entry.reasoner.provider is not None}

    def agent_schedules(self) -> dict[str, tuple[Schedule, ...]]:
        """Each agent's schedules by id, for agents that have some."""
        return {entry.id: entry.schedules for entry in self.agents if entry.schedules}

    def agent_configs(self) -> dict[str, AgentConfig]:
        """Each agent's lane policy by id, in file order (its runs' usage kept for the
        desk's budget, when there is one)."""
        configs = {entry.id: entry.agent_config() for entry in self.agents}
        if self.desk.budgets is None:
            return configs
        return {agent: config.model_copy(update={"budgets": config.budgets.model_copy(
            update={"desk_counted": True})}) for agent, config in configs.items()}

    def find_token(self, candidate: str) -> TokenConfig | None:
        """The token whose secret is ``candidate`` (every token compared in constant time)."""
        found = None
        for token in self.tokens:
            if token.matches(candidate):
                found = token
        return found


# ------------------------------------------------------------- validator helpers


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


def _first_of_each(section: str, key: str, label: str, names: Sequence[str],
                   problems: list[tuple[tuple[str | int, ...], str]]) -> dict[str, int]:
    """Each name's first index in ``section``; every repeat is a problem at its key."""
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in first:
            problems.append(((section, i, key),
                             f"duplicate {label} {name!r} (also {section}[{first[name]}])"))
        first.setdefault(name, i)
    return first


def _unknown_agent(agent: str) -> str:
    return f"unknown agent {agent!r}; add an [[agents]] table with id = {agent!r}"
