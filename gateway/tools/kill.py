"""``gateway kill``: one desk kill of a running gateway, over its HTTP API
(``POST /api/desk/kill``), with what it did to each agent."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import httpx2

Out = Callable[[str], None]
TIMEOUT_S = 30.0


def kill_command(url: str, token: str, reason: str | None, listing: bool, out: Out,
                 transport: httpx2.BaseTransport | None = None, flatten: bool = False) -> int:
    """Kill the desk, flattening each agent's positions with ``flatten`` (or,
    ``listing``, name the agents a kill would halt): 0 when every
    agent of the scope is HALTED, 1 when one is not (or the gateway refused), 2 when the
    gateway cannot be reached."""
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx2.Client(base_url=url.rstrip("/"), headers=headers, timeout=TIMEOUT_S,
                          transport=transport) as client:
            if listing:
                response = client.get("/api/desk/kill")
            else:
                body: dict[str, Any] = {} if reason is None else {"reason": reason}
                if flatten:
                    body["flatten"] = True
                response = client.post("/api/desk/kill", json=body)
    except httpx2.HTTPError as error:
        out(f"kill: cannot reach {url}: {error}")
        return 2
    answer: Any = _json(response)
    if response.status_code != 200 or not isinstance(answer, dict):
        code = answer.get("code") if isinstance(answer, dict) else None
        message = answer.get("message") if isinstance(answer, dict) else response.text[:200]
        out(f"kill: refused ({response.status_code} {code}): {message}")
        return 1
    if listing:
        agents = answer.get("agents", [])
        out(f"a desk kill would halt {len(agents)} agent{'' if len(agents) == 1 else 's'}"
            f"{' (the token is scoped)' if answer.get('scoped') else ''}: {', '.join(agents)}")
        return 0
    return _report(answer, out)


def _json(response: httpx2.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _report(answer: Mapping[str, Any], out: Out) -> int:
    kill = answer["kill"]
    agents = kill["agents"]
    for agent in agents:
        out(f"  {agent_line(agent)}")
    halted = answer["halted"]
    out(f"kill {kill['killId']} by {kill['principal']}: {halted} of {len(agents)} agents "
        f"HALTED, {answer['cancelsRequested']} cancels sent"
        f"{_flatten_total(answer) if kill.get('flatten') else ''} (recorded at position "
        f"{kill.get('position')})")
    return 0 if halted == len(agents) else 1


def _flatten_total(answer: Mapping[str, Any]) -> str:
    count = answer.get("flattenOrders", 0)
    return f", {count} flatten order{'' if count == 1 else 's'} sent"


def agent_line(agent: Mapping[str, Any]) -> str:
    """What a kill did to one agent, in a line."""
    name = agent["agentId"]
    if "error" in agent:
        return f"{name}: NOT halted: {agent['error']}: {agent.get('message', '')}"
    effect = agent.get("effect")
    if effect is None:
        return f"{name}: {agent.get('decision')}"
    done = [f"{effect['fromState']} -> {effect['toState']}"]
    if effect.get("abortedRun"):
        done.append(f"run {effect['abortedRun']} aborted")
    if effect.get("cancelsRequested"):
        done.append(f"{effect['cancelsRequested']} cancels sent")
    if not effect.get("changed"):
        done.append("nothing changed")
    orders = agent.get("flattenOrders")
    if orders:
        done.append("flatten: " + ", ".join(
            f"{o['side']} {o['qty']:g} {o['symbol']} ({o['orderId']})" for o in orders))
    elif agent.get("flattenNote"):
        done.append(f"flatten: {agent['flattenNote']}")
    return f"{name}: {', '.join(done)}"
