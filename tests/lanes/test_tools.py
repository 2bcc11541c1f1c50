"""The built-in tools' one definition: schemas, the arguments' check, the docs' table."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanes.tools import (
    TOOLS,
    NoArguments,
    ToolArgumentError,
    tool_arguments,
    tool_schema,
    tool_schemas,
    tools_table,
)
from lanes.vocabulary import OrderIntent

DOCS = Path(__file__).parents[2] / "docs" / "agents.md"


def test_the_docs_table_is_the_one_the_definitions_make() -> None:
    text = DOCS.read_text()
    found = re.search(r"<!-- tools -->\n(.*?)<!-- /tools -->", text, re.S)
    assert found is not None, "docs/agents.md lost its tools markers"
    assert found.group(1) == tools_table(), (
        "regenerate: uv run python -c 'from lanes.tools import tools_table; "
        "print(tools_table(), end=\"\")'")


@pytest.mark.parametrize("name", list(TOOLS))
def test_every_schema_is_an_object_schema_with_described_camel_case_fields(name: str) -> None:
    schema = tool_schema(TOOLS[name])
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert "title" not in schema
    for field, spec in schema["properties"].items():
        assert "_" not in field, field
        assert "title" not in spec
    assert TOOLS[name].description.endswith((".", "'.", ")."))
    assert tool_schemas()[name]["inputSchema"] == schema


def test_arguments_are_checked_and_every_problem_named() -> None:
    order = tool_arguments("place_order", {"symbol": "BTCUSD", "side": "buy", "qty": 0.5})
    assert order == OrderIntent(symbol="BTCUSD", side="buy", qty=0.5)
    assert tool_arguments("positions", {}) == NoArguments()
    with pytest.raises(ToolArgumentError) as bad:
        tool_arguments("place_order", {"symbol": "", "side": "hold", "qty": -1, "extra": 1})
    message = str(bad.value)
    for part in ("place_order", "symbol", "side", "qty", "extra"):
        assert part in message
    with pytest.raises(ToolArgumentError, match="unknown tool 'rm_rf'"):
        tool_arguments("rm_rf", {})
    assert tool_arguments("cancel_order", {"orderId": "o-1"}).model_dump() == {"orderId": "o-1"}


@given(st.sampled_from(list(TOOLS)), st.dictionaries(
    st.text(max_size=12), st.recursive(st.none() | st.booleans() | st.floats() | st.text(),
                                       lambda inner: st.lists(inner, max_size=3), max_leaves=5),
    max_size=4))
def test_any_arguments_are_taken_or_refused_with_a_readable_error(
        name: str, arguments: dict[str, Any]) -> None:
    refused: list[str] = []
    try:
        tool_arguments(name, arguments)
    except ToolArgumentError as error:
        refused.append(str(error))
    assert all(message.startswith(f"{name}: ") for message in refused)
