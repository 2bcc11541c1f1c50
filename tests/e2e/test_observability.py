"""The observability kit (examples/observability): Prometheus scrapes a live gateway as its
scrape config says (a viewer's bearer token read from a file), and every series that the
Grafana dashboard and the alerting rules query is on that gateway's ``/metrics``."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from gateway.config import parse_config
from gateway.edge.server import serving
from gateway.wiring import build_service
from tests.e2e.live import TIMEOUT
from tests.e2e.test_alerts import receiving
from tests.gateway.support import until

KIT = Path(__file__).resolve().parents[2] / "examples" / "observability"
PROMETHEUS_MADE = {"up"}
"""Series Prometheus makes for each target itself (never on a ``/metrics``)."""
VIEWER = "prometheus-viewer-token-1234"
CONTROL = "ops-control-token-5678"

CONFIG = """
[[tokens]]
name = "prometheus"
token = "{viewer}"
role = "viewer"

[[tokens]]
name = "ops"
token = "{control}"
role = "control"

[[providers]]
name = "sim-llm"
kind = "simulated"
[providers.limits]
requests_per_minute = 600
input_tokens_per_minute = 1000000
output_tokens_per_minute = 200000
max_concurrent = 2

[desk.budgets]
max_input_tokens_per_day = 100000000

[alerts]
[[alerts.webhooks]]
name = "ops-pager"
url = "{hook}"
secret_env = "OBSERVABILITY_HOOK_SECRET"

[[agents]]
id = "alpha"
mode = "followup"
[agents.reasoner]
provider = "sim-llm"
latency_ms = [5, 20]
seed = 1
[[agents.schedules]]
id = "audit"
every_ms = 60000

[[agents]]
id = "beta"
mode = "followup"
[agents.reasoner]
provider = "sim-llm"
latency_ms = [5, 20]
seed = 2
"""

# ------------------------------------------------------------ metric names out of PromQL

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_LABEL_LISTS = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSETS = re.compile(r"\boffset\s+-?\w+")
_GRAFANA = re.compile(r"\$\{?\w+\}?")  # ($__rate_interval, ${datasource}, $instance)
_LABEL_VALUES = re.compile(r"\blabel_values\(\s*([^,()]+?)\s*,\s*\w+\s*\)")
_WORD = re.compile(r"(?<![\w.:$])[A-Za-z_:][\w:]*")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without", "on",
             "ignoring", "group_left", "group_right"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana ``label_values(metric, label)``
    query) selects: every bare identifier that is not a function or aggregation (followed
    by a parenthesis), a keyword, a label (inside braces or a ``by (...)`` list), a
    duration or a Grafana variable."""
    text = _STRINGS.sub('""', expr)
    text = _LABEL_VALUES.sub(r"\1", text)
    for pattern in (_MATCHERS, _RANGES, _LABEL_LISTS, _OFFSETS, _GRAFANA):
        text = pattern.sub(" ", text)
    names = set()
    for found in _WORD.finditer(text):
        rest = text[found.end():].lstrip()
        if not rest.startswith("(") and found.group(0) not in _KEYWORDS:
            names.add(found.group(0))
    return names


def dashboard_queries(node: Any) -> list[str]:
    """Every query of a Grafana dashboard: its panels' targets (rows' panels too) and its
    templating variables'."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                found.append(value)
            elif key == "query" and node.get("type") == "query":
                found.append(value["query"] if isinstance(value, dict) else value)
            else:
                found += dashboard_queries(value)
    elif isinstance(node, list):
        for item in node:
            found += dashboard_queries(item)
    return found


def rule_queries(rules: dict[str, Any]) -> list[str]:
    """Every alerting or recording rule's expression of a Prometheus rule file."""
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def exposed(text: str) -> set[str]:
    """The names of the samples of a Prometheus text exposition (a histogram's
    ``_bucket``, ``_sum`` and ``_count``, not its family's name)."""
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            found = re.match(r"[A-Za-z_:][\w:]*", line)
            assert found is not None, line
            names.add(found.group(0))
    return names


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (le, provider) (rate(a_bucket{instance=~"$instance",x="y(z)"}[$__rate_interval]))',
     {"a_bucket"}),
    ("histogram_quantile(0.99, sum(rate(a_bucket[5m])) by (le)) > 0.5", {"a_bucket"}),
    ("rate(a_sum[5m]) / on (instance) group_left (version) b_info offset 1h * 1e3",
     {"a_sum", "b_info"}),
    ('topk(10, c{agent!="_other"}) and ignoring(agent) d == bool 1', {"c", "d"}),
    ('max by (instance) (up{job="gateway"}) == 0 unless e:recorded', {"up", "e:recorded"}),
    ("label_values(gateway_build_info, instance)", {"gateway_build_info"}),
    ('count by (version) (f{instance=~"${instance}"}) or vector(0)', {"f"}),
])
def test_metric_names_are_read_out_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


# ------------------------------------------------------------------- on a live gateway


def scrape_job() -> dict[str, Any]:
    """The kit's scrape job for the gateway, checked for what it must say."""
    config = yaml.safe_load((KIT / "prometheus.yml").read_text())
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "gateway"]
    auth = job["authorization"]
    assert auth.get("type", "Bearer") == "Bearer" and "credentials_file" in auth, auth
    assert "credentials" not in auth and "bearer_token" not in job  # (no token in the file)
    assert config["rule_files"] == ["alerts.yml"]
    assert job["metrics_path"] == "/metrics"
    return dict(job)


async def test_every_series_the_dashboard_and_the_rules_query_is_on_a_live_gateway(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dashboard = json.loads((KIT / "gateway-dashboard.json").read_text())
    queries = dashboard_queries(dashboard)
    rules = rule_queries(yaml.safe_load((KIT / "alerts.yml").read_text()))
    wanted = {name: query for query in [*queries, *rules] for name in metric_names(query)}
    assert len(queries) > 50 and len(rules) > 5 and len(wanted) > 40
    titles = " ".join(p["title"] for p in dashboard["panels"] if p["type"] == "row").lower()
    for topic in ("desk", "gates", "queues", "runs", "stops", "alerts", "schedules"):
        assert topic in titles, titles

    job = scrape_job()
    token_file = tmp_path / Path(job["authorization"]["credentials_file"]).name
    token_file.write_text(VIEWER + "\n")  # (as `echo` writes it; Prometheus trims it)
    monkeypatch.setenv("OBSERVABILITY_HOOK_SECRET", "whsec-observability")
    async with receiving([]) as hook:
        config = parse_config(CONFIG.format(viewer=VIEWER, control=CONTROL, hook=hook.url))
        service = build_service(config, tmp_path / "events.db")
        async with serving(service) as live, httpx2.AsyncClient(
                base_url=live.url, timeout=TIMEOUT,
                headers={"Authorization": f"Bearer {CONTROL}"}) as ops:
            # A run through the provider gate, and a stop (a halt alert, to the webhook).
            sent = await ops.post("/api/agents/alpha/requests", json={
                "requestId": "r1", "createdAt": datetime.now(UTC).isoformat(),
                "agentId": "alpha", "kind": "hook_trigger", "dedupeKey": "r1"})
            assert sent.status_code == 200, sent.text
            stopped = await ops.post("/api/agents/beta/control",
                                     json={"action": "emergency_stop"})
            assert stopped.status_code == 200, stopped.text
            engine = service.engine

            async def settled() -> bool:
                return engine.runs.durations.count >= 1 and len(hook.got) >= 1

            await until(settled, "a run to finish and the halt alert to reach the webhook")

            credentials = token_file.read_text().strip()
            scrape = f"{job.get('scheme', 'http')}://{live.url.split('://')[1]}"
            async with httpx2.AsyncClient(base_url=scrape, timeout=TIMEOUT) as prometheus:
                refused = await prometheus.get(job["metrics_path"])
                answer = await prometheus.get(job["metrics_path"], headers={
                    "Authorization": f"{job['authorization'].get('type', 'Bearer')} "
                                     f"{credentials}"})
    assert refused.status_code == 401
    assert answer.status_code == 200, answer.text
    names = exposed(answer.text)
    missing = {name: query for name, query in wanted.items()
               if name not in names | PROMETHEUS_MADE}
    assert missing == {}, f"queried and not on /metrics: {missing}"
