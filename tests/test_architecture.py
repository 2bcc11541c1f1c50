"""The layering holds: lanes/ is pure, store/ alone talks to the database."""

from __future__ import annotations

import ast
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMPURE_MODULES = {
    "asyncio", "sqlalchemy", "aiosqlite", "sqlite3", "alembic", "starlette", "websockets",
    "uvicorn", "httpx", "httpx2", "anthropic", "openai", "socket", "threading", "subprocess",
    "time", "random", "secrets", "uuid", "os", "io", "pathlib", "gateway", "store",
}
CLOCK_CALLS = {("datetime", "now"), ("datetime", "utcnow"), ("date", "today"),
               ("datetime", "today")}
DATABASE_MODULES = {"sqlalchemy", "aiosqlite", "sqlite3", "alembic"}


def python_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def imported_roots(tree: ast.AST) -> set[str]:
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", python_files("lanes"), ids=lambda p: str(p.relative_to(ROOT)))
def test_lanes_imports_nothing_impure(path: Path) -> None:
    tree = ast.parse(path.read_text())
    assert imported_roots(tree) & IMPURE_MODULES == set()


@pytest.mark.parametrize("path", python_files("lanes"), ids=lambda p: str(p.relative_to(ROOT)))
def test_lanes_never_reads_a_clock_or_does_io(path: Path) -> None:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                assert (func.value.id, func.attr) not in CLOCK_CALLS, f"clock read in {path}"
            if isinstance(func, ast.Name):
                assert func.id not in {"open", "print", "input"}, f"I/O in {path}"


def test_the_purity_check_can_fail() -> None:
    tree = ast.parse("import asyncio\nfrom sqlalchemy import select\n")
    assert imported_roots(tree) & IMPURE_MODULES == {"asyncio", "sqlalchemy"}


@pytest.mark.parametrize("package", ["lanes", "gateway"])
def test_only_store_talks_to_the_database(package: str) -> None:
    for path in python_files(package):
        assert imported_roots(ast.parse(path.read_text())) & DATABASE_MODULES == set(), path


def imported_modules(path: Path) -> set[str]:
    """The modules a file imports by absolute name (``gateway.runtime.engine``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize(("module", "forbidden"), [
    ("gateway/runtime/core.py", {"gateway.runtime.engine", "gateway.runtime.gate"}),
    ("gateway/runtime/gate.py", {"gateway.runtime.engine"}),
])
def test_the_runtime_core_sits_under_the_engine_and_the_gate(
        module: str, forbidden: set[str]) -> None:
    """One core under both: the gate does not reach into the engine (no import cycle), and
    the core knows neither."""
    assert imported_modules(ROOT / module) & forbidden == set()


LAYERS: list[frozenset[str]] = [
    frozenset({"gateway.errors"}),
    frozenset({"gateway.base"}),
    frozenset({"gateway.llm", "gateway.market"}),
    frozenset({"gateway.runtime"}),
    frozenset({"gateway.cluster"}),
    frozenset({"gateway.config"}),
    frozenset({"gateway.tools"}),
    frozenset({"gateway.reads"}),
    frozenset({"gateway.edge"}),
    frozenset({"gateway.client", "gateway.wiring"}),
    frozenset({"gateway.cli"}),
    frozenset({"gateway.__main__"}),
]
"""The parts of ``gateway/``, lowest first: a module imports only its own part and parts of
lower layers (never one beside it), so arrows between them point one way, down."""
RANK = {part: rank for rank, layer in enumerate(LAYERS) for part in layer}


def part_of(module: str) -> str:
    """The part of ``gateway/`` a module belongs to (``gateway.runtime.engine`` ->
    ``gateway.runtime``)."""
    return ".".join(module.split(".")[:2])


def gateway_imports(module: str, source: str) -> set[str]:
    """Every ``gateway`` module that ``module``'s source imports, wherever the import sits
    (``if TYPE_CHECKING:`` blocks and function bodies included), relative ones resolved."""
    found = set()
    package = module.split(".")[:-1]  # (``gateway.base.__init__``: ``gateway.base``)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[:len(package) - node.level + 1], *filter(None, [base])])
            # ``from gateway import config`` imports the module gateway.config
            found |= {f"{base}.{alias.name}" if base == "gateway" else base
                      for alias in node.names}
    return {name for name in found if name.startswith("gateway.")}


def upward_imports(module: str, source: str) -> list[str]:
    """The imports of ``module`` that point at its own layer's neighbours or higher up."""
    mine = part_of(module)
    return sorted(f"{module} imports {name}" for name in gateway_imports(module, source)
                  if part_of(name) != mine and RANK[part_of(name)] >= RANK[mine])


def gateway_modules() -> list[tuple[str, Path]]:
    return [(".".join(path.relative_to(ROOT).with_suffix("").parts), path)
            for path in python_files("gateway") if path.name != "__init__.py"
            or path.parent != ROOT / "gateway"]


def test_every_part_of_the_gateway_has_a_layer() -> None:
    """A new package or top-level module of ``gateway/`` must be given its place."""
    assert {part_of(module) for module, _ in gateway_modules()} - RANK.keys() == set()


def test_arrows_between_the_parts_of_the_gateway_point_down() -> None:
    upward = [line for module, path in gateway_modules()
              for line in upward_imports(module, path.read_text())]
    assert upward == []


def test_the_layer_check_can_fail() -> None:
    source = ("from typing import TYPE_CHECKING\n"
              "from gateway.errors import BadFrame\n"
              "if TYPE_CHECKING:\n    from gateway.runtime.engine import Engine\n"
              "def late() -> None:\n    from gateway.llm import reasoner\n"
              "from ..edge import protocol\n")
    assert upward_imports("gateway.market.fake", source) == [
        "gateway.market.fake imports gateway.edge",
        "gateway.market.fake imports gateway.llm",
        "gateway.market.fake imports gateway.runtime.engine",
    ]
    assert upward_imports("gateway.edge.fake", source) == []


CHECKS = re.compile(r"\bassert\b|pytest\.raises|pytest\.fail|\bexpect\(|\bassert_\w+\(|\bfails\(|"
                    r"\bcheck\w*\(|\.run_state_machine|\brun_invariants\(")
"""What makes a test able to fail: an assert, an expected error, Playwright's expect, or a
helper that asserts (``assert_*``, ``fails``, ``check*``)."""


def test_every_test_can_fail() -> None:
    """No test passes whatever the code does: each one checks something."""
    idle = []
    for path in python_files("tests"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                    node.name.startswith("test_") and not CHECKS.search(ast.unparse(node)):
                idle.append(f"{path.relative_to(ROOT)}::{node.name}")
    assert idle == []


def test_the_runtime_knows_nothing_of_who_owns_what() -> None:
    """Ownership lives in `gateway.cluster`: the engine and the gates hold only what they
    decide for (load / unload / drop), so no file of the runtime speaks of what is owned."""
    for path in python_files("gateway/runtime"):
        assert not re.search(r"\bowned\b", path.read_text()), path


TASK_CALLS = frozenset({"create_task", "ensure_future"})
WAIT_HOMES = frozenset({"gateway/base/clock.py", "gateway/base/tasks.py"})
"""Where the gateway's sleeps and tasks are made (`Clock`, `spawn`, `start`, `sleep_or`)."""


def own_waits_and_tasks(source: str) -> list[str]:
    """What a module sleeps or starts by itself rather than through the `Clock` and
    `gateway.base.tasks`: an ``asyncio.sleep`` of more than nothing (``sleep(0)`` only lets
    other work run), a ``create_task`` or ``ensure_future`` (on any object)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, owner = node.func.attr, node.func.value
        if name in TASK_CALLS:
            found.append((node.lineno, name))
        elif name == "sleep" and isinstance(owner, ast.Name) and owner.id == "asyncio" and not (
                len(node.args) == 1 and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == 0):
            found.append((node.lineno, "asyncio.sleep"))
    return [f"{name} (line {line})" for line, name in sorted(found)]


def waits_found(check: Callable[[str], list[str]]) -> dict[str, list[str]]:
    """What ``check`` finds in each module of the gateway that makes its own waits (not
    `WAIT_HOMES`; not `gateway.client`, which stands alone), by module."""
    found = {}
    for path in python_files("gateway"):
        name = str(path.relative_to(ROOT))
        if name in WAIT_HOMES or name.startswith("gateway/client/"):
            continue
        if waits := check(path.read_text()):
            found[name] = waits
    return found


def test_every_wait_goes_through_the_clock_and_every_task_through_base() -> None:
    """A sleep of the gateway is of its `Clock` (a test's fake clock drives it), a task is
    made by `spawn` or `start`; `gateway.client`, which stands alone, has its own. (A
    timeout of the gateway's own rules, the feed's hold, a run's wait for its worker, a
    worker's heartbeats, an MCP caller's wait, is the `Clock`'s `timeout`; one on I/O, a
    peer's or a socket's, stays on the event loop's time: `LOOP_TIME_WAITS`.)"""
    assert waits_found(own_waits_and_tasks) == {}


LOOP_TIME_WAITS: Final = {
    "gateway/edge/sessions.py": 3,  # a client's token, a send to a slow reader, its close
    "gateway/edge/server.py": 3,  # a close's reply, a stuck close, a request's head
    "gateway/llm/fake_provider.py": 2,  # the fake provider's own serving (tests, benches)
    "gateway/llm/providers.py": 2,  # a provider's HTTP call
    "gateway/llm/mcp_tools.py": 4,  # an MCP server's start, listing and call
    "gateway/reads/capacity.py": 1,  # the first wait for a read of the log
    "gateway/cluster/member.py": 2,  # the database's lease calls
    "gateway/cluster/replicas.py": 1,  # a replica's read of the log
}
"""The waits of the gateway on the event loop's time, by module: each on I/O (a peer's, a
socket's, the database's). A timeout of the gateway's own rules counts the `Clock`'s time
(`gateway.base.clock.timeout`, ``clock.call_at``), so that a test's fake clock drives it."""


def loop_time_waits(source: str) -> list[str]:
    """The waits of a module on the event loop's time: ``asyncio.timeout``, ``wait_for``,
    ``call_later`` (on any object) and ``.time()`` of a loop."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, owner = node.func.attr, node.func.value
        if name in ("wait_for", "call_later") or (
                name == "timeout" and isinstance(owner, ast.Name) and owner.id == "asyncio") or (
                name == "time" and not node.args and "loop" in ast.unparse(owner)):
            found.append((node.lineno, name))
    return [f"{name} (line {line})" for line, name in sorted(found)]


def test_only_waits_on_io_count_the_event_loops_time() -> None:
    """Every wait on the loop's time is one of `LOOP_TIME_WAITS` (a new one is either the
    `Clock`'s or written there with the I/O it waits on); `gateway.client` stands alone."""
    found = waits_found(loop_time_waits)
    assert {name: len(waits) for name, waits in found.items()} == LOOP_TIME_WAITS, found


def test_the_loop_time_check_can_fail() -> None:
    source = ("import asyncio\nasync def f(loop, clock):\n    async with asyncio.timeout(1):\n"
              "        await asyncio.wait_for(f(loop, clock), 2)\n"
              "    loop.call_later(1, print)\n    t = loop.time()\n"
              "    async with timeout(clock, 5):\n        clock.call_at(clock.now_ms(), print)\n")
    assert loop_time_waits(source) == ["timeout (line 3)", "wait_for (line 4)",
                                       "call_later (line 5)", "time (line 6)"]


def private_reaches(source: str) -> list[str]:
    """Where a module reads a private field of an engine it holds (``engine._x``,
    ``self._engine._x``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else \
                owner.attr if isinstance(owner, ast.Attribute) else ""
            if name in ("engine", "_engine"):
                found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return found


def test_the_engines_rooms_use_its_public_face() -> None:
    """No module of the gateway reaches into the engine's private fields: its rooms (the
    intake, holding, recovery...) use what it says it offers."""
    offenders = {str(path.relative_to(ROOT)): found for path in python_files("gateway")
                 if (found := private_reaches(path.read_text()))}
    assert offenders == {}
    assert private_reaches("def f(engine, me):\n    engine._agents\n    me._engine._feed(1)\n"
                           "    engine.agents\n    engine.__class__\n") == [
        "engine._agents (line 2)", "me._engine._feed (line 3)"]


def test_a_fast_test_may_not_serve_on_a_socket() -> None:
    """The fast layer's guard (`tests/conftest.py`): this test is in the layer, so serving on
    TCP fails it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        with pytest.raises(AssertionError, match="serves on a socket"):
            sock.listen(1)


def test_the_wait_check_can_fail() -> None:
    source = ("import asyncio\nasync def f(loop):\n    await asyncio.sleep(0)\n"
              "    await asyncio.sleep(0.5)\n    loop.create_task(f(loop))\n"
              "    asyncio.ensure_future(f(loop))\n")
    assert own_waits_and_tasks(source) == ["asyncio.sleep (line 4)", "create_task (line 5)",
                                           "ensure_future (line 6)"]


@pytest.mark.parametrize("package", ["gateway", "lanes", "store"])
def test_rooms_are_of_human_size(package: str) -> None:
    """No file of gateway/, lanes/ or store/ over 600 lines, no class over 400: a room
    that grows past that is cut along its seams first."""
    for path in python_files(package):
        name = str(path.relative_to(ROOT))
        text = path.read_text()
        assert text.count("\n") <= 600, f"{name}: {text.count(chr(10))} lines"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                assert size <= 400, f"{name}: class {node.name} is {size} lines"


@pytest.mark.parametrize("package", ["gateway/edge", "gateway/reads"])
def test_the_edge_reads_the_log_through_its_narrow_port(package: str) -> None:
    """The edge and the read models read the log through `store.port.LogReads` (the
    service's ``log``); they never reach the engine's store, which can also write."""
    for path in python_files(package):
        text = path.read_text()
        allowed = 1 if path.name == "service.py" else 0  # (`Service.log` itself)
        assert text.count("engine.store") == allowed, path
        assert not re.search(r"\bEventStore\b", text), path


CLIENT_DEPENDENCIES = {"pydantic", "websockets", "httpx2"}
"""What `gateway.client` may import besides the standard library and itself: the
dependencies of its own distribution (clients/python/pyproject.toml)."""


def foreign_imports(source: str) -> set[str]:
    """The imports of a module of ``gateway.client`` that its distribution does not carry."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 1:
            found.add(f"{'.' * node.level}{node.module or ''}")  # (above gateway.client)
    return {name for name in found
            if not name.startswith("gateway.client")
            and name.split(".")[0] not in CLIENT_DEPENDENCIES | set(sys.stdlib_module_names)}


def test_the_client_stands_alone() -> None:
    """`gateway.client` imports nothing of the gateway but itself (no lanes, no server
    frames), so its distribution carries it alone; the HTTP library is imported in one
    module only, so that it can be switched there."""
    paths = python_files("gateway/client")
    assert paths
    assert [f"{path.name}: {sorted(found)}" for path in paths
            if (found := foreign_imports(path.read_text()))] == []
    http = [path.name for path in paths if "httpx2" in imported_roots(ast.parse(path.read_text()))]
    assert http == ["http.py"]


def test_the_client_check_can_fail() -> None:
    source = ("import json\nfrom lanes import AgentRequest\nfrom ..edge import protocol\n"
              "from gateway.edge.protocol import Hello\nfrom .wire import parse\n")
    assert foreign_imports(source) == {"lanes", "gateway.edge.protocol",
                                                         "..edge"}


def test_one_http_client_library() -> None:
    """The runtime depends on one HTTP client, httpx2 (the provider SDKs and the MCP SDK need
    it); no code of ours imports the older httpx, and no dependency list names it."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = [*project["project"]["dependencies"],
              *(d for group in project["dependency-groups"].values() for d in group)]
    names = [re.split(r"[=<>!~;\[ ]", entry, maxsplit=1)[0].lower() for entry in listed]
    assert "httpx2" in names and "httpx" not in names
    for package in ("gateway", "lanes", "store", "migrations", "bench", "tests", "examples"):
        for path in python_files(package):
            assert "httpx" not in imported_roots(ast.parse(path.read_text())), path
