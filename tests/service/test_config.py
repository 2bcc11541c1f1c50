"""The TOML config: the example loads, every problem names its key, secrets stay secret."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.base.roles import Role
from gateway.config import (
    AgentEntry,
    ConfigError,
    GatewayConfig,
    SimulatedReasonerConfig,
    WorkerReasonerConfig,
    build_clients,
    build_reasoner,
    demo_config,
    load_config,
    parse_config,
)
from gateway.llm.providers import OpenAIClient
from gateway.llm.reasoner import SimulatedReasoner
from gateway.runtime.workers import WorkerReasoner
from gateway.wiring import build_service
from lanes import AgentConfig, Mode
from store import SqliteEventStore

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway.toml"
ENV = {"GATEWAY_TOKEN_ADMIN": "admin-secret-from-env"}

MINIMAL = """
[[agents]]
id = "a1"
mode = "collect"
debounce_ms = 500

[[tokens]]
name = "ops"
token = "s3cret-ops"
role = "control"
"""


def problems(text: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The problems of an invalid config, by key path."""
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "test.toml", env=env or {})
    return {p.path: p.message for p in caught.value.problems}


def test_the_example_file_loads() -> None:
    config = load_config(EXAMPLE, env=ENV)
    assert [a.id for a in config.agents] == ["agent_btc_5m", "agent_eth_1m", "agent_news"]
    btc = config.agent("agent_btc_5m")
    assert btc.agent_config().mode is Mode.COLLECT
    assert btc.agent_config().budgets.max_runs_per_hour == 12
    assert config.agent("agent_news").agent_config().halt_on_alerts == ("connector_down",)
    assert {h.kind for h in config.hooks} == {"price_cross", "green_candles", "connector_down"}
    admin = config.tokens[3]
    assert admin.role is Role.ADMIN and admin.secret == ENV["GATEWAY_TOKEN_ADMIN"]
    assert config.find_token(ENV["GATEWAY_TOKEN_ADMIN"]) is admin
    assert config.find_token("nope") is None
    assert config.tokens[1].allows("agent_btc_5m") and not config.tokens[1].allows("agent_news")


def test_a_desk_budget_counts_every_agents_usage_and_a_bad_one_names_its_field() -> None:
    config = parse_config(MINIMAL + "\n[desk.budgets]\nmax_spend_per_day = 50\n")
    assert config.desk.budgets is not None
    assert config.desk.budgets.budgets().max_spend_per_day == 50
    assert all(c.budgets.desk_counted for c in config.agent_configs().values())
    assert not any(c.budgets.desk_counted for c in parse_config(MINIMAL).agent_configs().values())
    found = problems(MINIMAL + "\n[desk.budgets]\nmax_spend_per_day = -1\nalert_at = [1.5]\n")
    assert set(found) == {"desk.budgets.max_spend_per_day", "desk.budgets.alert_at"}


def test_an_agents_mcp_servers_give_its_model_their_tools_by_qualified_name() -> None:
    text = MINIMAL.replace('id = "a1"', 'id = "a1"\ntools = ["positions"]') + """
[[agents.mcp]]
name = "news"
url = "https://news.example/mcp"
headers_env = {Authorization = "NEWS_TOKEN"}
tools = ["headlines", "sentiment"]
"""
    config = parse_config(text, env={"NEWS_TOKEN": "Bearer abc"})
    agent = config.agent("a1")
    assert agent.agent_config().mcp_tools == ("news__headlines", "news__sentiment")
    assert agent.agent_config().tools == ("positions",)
    assert agent.mcp[0].spec().headers == {"Authorization": "Bearer abc"}
    found = problems(text, env={})
    assert any("NEWS_TOKEN is not set" in m for m in found.values()), found
    both = problems(text.replace('url = "https://news.example/mcp"',
                                 'url = "https://n/mcp"\ncommand = ["x"]'),
                    env={"NEWS_TOKEN": "t"})
    assert any("either command" in m for m in both.values()), both


def test_defaults_and_camel_case_keys() -> None:
    config = parse_config(MINIMAL + "\n[server]\nmaxFrameBytes = 2048\n")
    assert config.server.host == "127.0.0.1" and config.server.port == 8000
    assert config.server.max_frame_bytes == 2048
    assert config.store.synchronous == "FULL"
    assert config.agent_configs() == {"a1": AgentConfig(mode=Mode.COLLECT, debounce_ms=500)}


@pytest.mark.parametrize("by_alias", [False, True])
def test_an_agent_entry_takes_every_agent_config_field(by_alias: bool) -> None:
    wanted = AgentConfig(mode=Mode.QUEUE, cap=7, max_call_depth=5, halt_on_alerts=("x",))
    fields = wanted.model_dump(mode="json", by_alias=by_alias)
    assert len(fields) == len(AgentConfig.model_fields)
    entry = AgentEntry.model_validate({"id": "x", **fields})
    assert entry.agent_config() == wanted
    assert AgentEntry.model_validate(entry.model_dump()) == entry  # a dump round-trips


def test_build_reasoner_and_the_demo_config() -> None:
    config = demo_config()
    modes = {a.agent_config().mode for a in config.agents}
    assert len(config.agents) == 3 and len(modes) == 3
    assert {t.role for t in config.tokens} == set(Role)
    assert len({t.secret for t in config.tokens}) == len(config.tokens)
    assert demo_config().tokens[0].secret != config.tokens[0].secret  # fresh each time
    reasoner = build_reasoner(config.agents[0])
    assert isinstance(reasoner, SimulatedReasoner)
    settings = config.agents[0].reasoner
    assert isinstance(settings, SimulatedReasonerConfig)
    assert reasoner.latency_ms == settings.latency_ms


def test_the_commit_batch_size_is_a_store_setting(tmp_path: Path) -> None:
    config = parse_config(MINIMAL + "[store]\nmax_batch = 300\n")
    assert config.store.max_batch == 300 and parse_config(MINIMAL).store.max_batch == 2000
    store = build_service(config, tmp_path / "events.db").engine.store
    assert isinstance(store, SqliteEventStore) and store.max_batch == 300


@pytest.mark.parametrize(
    ("text", "path", "words"),
    [
        (MINIMAL + "[server]\nprot = 8000\n", "server.prot", "unknown key"),
        (MINIMAL.replace('mode = "collect"', 'mode = "sometimes"'), "agents[0].mode",
         "'sometimes'"),
        (MINIMAL.replace("debounce_ms = 500", "debounce_ms = -1"), "agents[0].debounce_ms",
         "greater than or equal to 0"),
        (MINIMAL + '[[agents]]\nid = "a1"\n', "agents[1].id", "duplicate agent id 'a1'"),
        (MINIMAL + '[[hooks]]\nkind = "price_cross"\nname = "x"\nsymbol = "BTCUSD"\n'
         'level = 1.0\nagents = ["a1", "ghost"]\n', "hooks[0].agents[1]", "unknown agent 'ghost'"),
        (MINIMAL + '[[hooks]]\nkind = "price_cross"\nname = "x"\nsymbol = "BTCUSD"\n'
         'level = 0\nagents = ["a1"]\n', "hooks[0].level", "greater than 0"),
        (MINIMAL + '[[hooks]]\nkind = "rsi"\nname = "x"\n', "hooks[0].kind", "unknown kind 'rsi'"),
        (MINIMAL + '[agents.reasoner]\nkind = "anthropic"\n', "agents[0].reasoner.kind",
         "unknown kind 'anthropic'"),
        (MINIMAL + "[agents.reasoner]\nlatency_ms = [900, 100]\n",
         "agents[0].reasoner.latency_ms", "low <= high"),
        (MINIMAL + "[agents.budgets]\nmax_runs_per_hour = 0\n",
         "agents[0].budgets.max_runs_per_hour", "greater than or equal to 1"),
        (MINIMAL + '[[tokens]]\nname = "ops"\ntoken = "other"\nrole = "viewer"\n',
         "tokens[1].name", "duplicate token name"),
        (MINIMAL + '[[tokens]]\nname = "bad"\ntoken = "x"\nrole = "root"\n', "tokens[1].role",
         "'root'"),
        (MINIMAL + '[[tokens]]\nname = "v"\ntoken = "x"\nrole = "viewer"\nagents = ["ghost"]\n',
         "tokens[1].agents[0]", "unknown agent 'ghost'"),
        (MINIMAL + '[[tokens]]\nname = "b"\ntoken = "x"\ntoken_env = "T"\nrole = "feed"\n',
         "tokens[1].token_env", "not both"),
        (MINIMAL + '[[tokens]]\nname = "n"\nrole = "feed"\n', "tokens[1].token", "token_env"),
        (MINIMAL + '[[tokens]]\nname = "e"\ntoken_env = "MISSING_VAR"\nrole = "feed"\n',
         "tokens[1].token_env", "MISSING_VAR is not set"),
        (MINIMAL + '[[tokens]]\nname = "dup"\ntoken = "s3cret-ops"\nrole = "feed"\n',
         "tokens[1].token", "same secret as tokens[0]"),
        (MINIMAL + '[server]\nallowed_origins = ["http://ok:1", "http://x/path"]\n',
         "server.allowed_origins[1]", "not an origin"),
        (MINIMAL + "[store]\nmax_batch = 0\n", "store.max_batch", "greater than or equal to 1"),
    ],
)
def test_each_problem_names_its_key(text: str, path: str, words: str) -> None:
    found = problems(text, env={"T": "from-env"})
    assert path in found, found
    assert words in found[path]


def test_every_problem_is_listed_in_the_message() -> None:
    text = MINIMAL.replace("debounce_ms = 500", "debounce_ms = -1\ncapp = 3")
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "two.toml")
    message = str(caught.value)
    assert message.startswith("two.toml: invalid config")
    assert "agents[0].debounce_ms: " in message
    assert "agents[0].capp: unknown key; remove it (did you mean 'cap'?)" in message


def test_a_syntax_error_says_line_and_column() -> None:
    found = problems('[server]\nhost = "127.0.0.1"\nport = = 3\n')
    assert list(found) == ["line 3, column 8"]
    assert found["line 3, column 8"].startswith("TOML syntax error")


def test_an_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


def test_the_secret_never_shows() -> None:
    config = parse_config(
        MINIMAL + '[[tokens]]\nname = "env"\ntoken_env = "T"\nrole = "admin"\n',
        env={"T": "env-secret-value"},
    )
    assert config.tokens[0].secret == "s3cret-ops"
    assert config.tokens[1].secret == "env-secret-value"
    for shown in (repr(config), str(config), repr(config.tokens[0]), str(config.tokens[1]),
                  config.model_dump_json(), str(config.model_dump())):
        assert "s3cret-ops" not in shown and "env-secret-value" not in shown
    assert "ops" in repr(config.tokens[0])  # the name is shown, only the secret is hidden


def test_a_rejected_secret_is_not_echoed() -> None:
    text = MINIMAL.replace('role = "control"', 'role = "nope"')
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    assert "s3cret-ops" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_the_models_reject_unknown_fields_directly() -> None:
    with pytest.raises(ValueError, match="extra"):
        GatewayConfig.model_validate({"nonsense": 1})


CLAUDE = """
[[providers]]
name = "claude"
kind = "anthropic"
model = "claude-sonnet-4-5"
"""
GPT = """
[[providers]]
name = "gpt"
kind = "openai"
model = "llama-3.1-70b"
base_url = "http://127.0.0.1:8080/v1"
api_key = "k"
"""
LLM_AGENT = """
[[agents]]
id = "a2"
[agents.reasoner]
kind = "llm"
provider = "claude"
"""


@pytest.mark.parametrize(
    ("text", "path", "words"),
    [
        (MINIMAL + CLAUDE, "providers[0].api_key_env", "ANTHROPIC_API_KEY is not set"),
        (MINIMAL + CLAUDE.replace('model = "claude-sonnet-4-5"', 'api_key = "k"'),
         "providers[0].model", "missing"),
        (MINIMAL + CLAUDE + 'api_key = "k"\n' + LLM_AGENT.replace('"claude"', '"gpt"'),
         "agents[1].reasoner.provider", "unknown provider 'gpt'"),
        (MINIMAL + '[[providers]]\nname = "sim"\nkind = "simulated"\n'
         + LLM_AGENT.replace('"claude"', '"sim"'), "agents[1].reasoner.provider",
         "an llm reasoner needs an anthropic or openai provider"),
        (MINIMAL + CLAUDE + 'api_key = "k"\n[providers.limits]\nlease_ms = 60000\n' + LLM_AGENT,
         "providers[0].limits.lease_ms", "not longer than the run timeout of agent 'a2'"),
        (MINIMAL + CLAUDE + 'api_key = "k"\n[providers.limits]\nrequests_per_minute = 0\n',
         "providers[0].limits.requests_per_minute", "greater than or equal to 1"),
        (MINIMAL + CLAUDE + 'api_key = "k"\n[providers.limits]\nrpm = 5\n',
         "providers[0].limits.rpm", "unknown key"),
        (MINIMAL + CLAUDE + 'api_key = "k"\n' + CLAUDE + 'api_key = "j"\n', "providers[1].name",
         "duplicate provider name"),
        (MINIMAL + '[[providers]]\nname = "x"\nkind = "mistral"\n', "providers[0].kind",
         "'mistral'"),
        (MINIMAL + CLAUDE + 'api_key = ""\n', "providers[0].api_key", "must not be empty"),
        (MINIMAL + CLAUDE + 'api_key = "k"\n[[agents]]\nid = "s"\n[agents.reasoner]\n'
         'provider = "claude"\n', "agents[1].reasoner.provider", "a real one"),
        (MINIMAL + CLAUDE + 'api_key = "k"\n[providers.limits]\noutput_tokens_per_minute = 500\n'
         + LLM_AGENT, "agents[1].reasoner.max_tokens", "no call could ever be granted"),
        (MINIMAL + CLAUDE + 'api_key = "k"\nmax_tokens_param = "max_tokens"\n',
         "providers[0].max_tokens_param", "only an openai provider takes it, not anthropic"),
        (MINIMAL + GPT + 'max_tokens_param = "tokens"\n', "providers[0].max_tokens_param",
         "'max_completion_tokens' or 'max_tokens'"),
    ],
)
def test_each_provider_problem_names_its_key(text: str, path: str, words: str) -> None:
    found = problems(text)
    assert path in found, found
    assert words in found[path]


async def test_an_openai_provider_names_its_max_tokens_field() -> None:
    for given, used in (("", "max_completion_tokens"),
                        ('max_tokens_param = "max_tokens"\n', "max_tokens")):
        client = build_clients(parse_config(MINIMAL + GPT + given))["gpt"]
        assert isinstance(client, OpenAIClient)
        assert client.max_tokens_param == used
        await client.close()


def test_a_provider_key_comes_from_the_environment_and_is_never_shown() -> None:
    config = parse_config(MINIMAL + CLAUDE + LLM_AGENT, env={"ANTHROPIC_API_KEY": "sk-live-123"})
    provider = config.providers[0]
    assert provider.secret == "sk-live-123"
    assert "sk-live-123" not in repr(config) + str(config) + config.model_dump_json()
    assert config.agent_gates() == {"a2": "claude"}


@pytest.mark.parametrize("name", ["scheduler", "config"])
def test_no_token_takes_a_name_the_gateway_records_its_own_work_under(name: str) -> None:
    found = problems(MINIMAL.replace('name = "ops"', f'name = "{name}"'))
    assert "is the gateway's own" in found["tokens[0].name"]


def test_schedules_in_the_config_file_are_checked() -> None:
    text = MINIMAL + '\n[[agents.schedules]]\nid = "x"\ncron = "61 * * * *"\n'
    assert "is not a cron expression" in problems(text)["agents[0].schedules"]
    twice = MINIMAL + '\n[[agents.schedules]]\nid = "x"\nevery_ms = 60000\n' * 2
    assert "repeated: x" in problems(twice)["agents[0].schedules"]


def test_a_worker_agent_gets_a_worker_reasoner_on_the_services_hub(tmp_path: Path) -> None:
    config = parse_config(MINIMAL + '[agents.reasoner]\nkind = "worker"\nheartbeat_ms = 700\n')
    settings = config.agents[0].reasoner
    assert isinstance(settings, WorkerReasonerConfig) and settings.missed_heartbeats == 3
    service = build_service(config, tmp_path / "events.db")
    reasoner = service.workers.agents["a1"]
    assert isinstance(reasoner, WorkerReasoner) and reasoner.heartbeat_ms == 700
    assert service.workers.missing("a1")
    with pytest.raises(ValueError, match="missed_heartbeats"):
        parse_config(MINIMAL + '[agents.reasoner]\nkind = "worker"\nmissed_heartbeats = 0\n')


def test_kept_demo_tokens_survive_a_role_added_since(tmp_path: Path) -> None:
    kept = tmp_path / "tokens.json"
    first = {t.role: t.secret for t in demo_config(tokens=kept).tokens}
    older = {role.value: first[role] for role in Role if role is not Role.WORKER}
    kept.write_text(json.dumps(older))  # kept before there were worker tokens
    again = {t.role: t.secret for t in demo_config(tokens=kept).tokens}
    assert {role: again[role] for role in Role if role is not Role.WORKER} == \
        {role: first[role] for role in Role if role is not Role.WORKER}
    assert again[Role.WORKER] and json.loads(kept.read_text())["worker"] == again[Role.WORKER]


@pytest.mark.parametrize(
    ("text", "path", "words"),
    [
        (MINIMAL + "[market]\ntick = 0\n", "market.tick", "greater than 0"),
        (MINIMAL + '[[market.symbols]]\nsymbol = "BTCUSD"\n', "market.symbols[0].tick",
         "missing"),
        (MINIMAL + '[[market.symbols]]\nsymbol = "BTC USD"\ntick = 1\n',
         "market.symbols[0].symbol", "pattern"),
        (MINIMAL + '[[market.symbols]]\nsymbol = "BTCUSD"\ntick = 0.5\n'
         '[[market.symbols]]\nsymbol = "BTCUSD"\ntick = 1\n', "market",
         "symbols[1].symbol: BTCUSD is listed twice"),
    ],
)
def test_each_tick_problem_names_its_key(text: str, path: str, words: str) -> None:
    found = problems(text)
    assert path in found, found
    assert words in found[path]


def test_a_symbols_tick_defaults_to_the_markets(tmp_path: Path) -> None:
    config = parse_config(MINIMAL + '[market]\ntick = 0.001\n[[market.symbols]]\n'
                                    'symbol = "BTCUSD"\ntick = 0.5\n')
    market = build_service(config, tmp_path / "events.db").engine.runs.toolbox.market
    assert (market.tick_of("BTCUSD"), market.tick_of("ETHUSD")) == (0.5, 0.001)
    assert parse_config(MINIMAL).market.tick == 0.01
