"""`services.gateway.mcp.tools`: the `{"type": "mcp"}` tool entries (400s with the offending
`param`), the approval policy, and how MCP tools are offered to the model as functions."""

from __future__ import annotations

import re
from typing import Any

import pytest

from services.gateway.mcp.tools import (
    ALWAYS,
    FUNCTION_NAME_PATTERN,
    NEVER,
    ApprovalPolicy,
    ListedTool,
    McpServerSpec,
    ToolDirectory,
    ToolFilter,
    function_name,
    parse_function_name,
    parse_mcp_tool,
    parse_mcp_tools,
)
from services.gateway.protocol_common.openai_error import OpenAIError

URL = "https://mcp.example.com/mcp"


def mcp(**kw: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "weather", "server_url": URL, **kw}


def refused(entry: dict[str, Any] | list[Any], param: str) -> OpenAIError:
    with pytest.raises(OpenAIError) as info:
        parse_mcp_tools(entry if isinstance(entry, list) else [entry])
    assert info.value.status == 400
    assert info.value.param == param, info.value.message
    return info.value


# ---- parsing --------------------------------------------------------------------------------------


def test_minimal_entry_defaults_to_approval_always() -> None:
    [spec] = parse_mcp_tools([mcp()])
    assert spec == McpServerSpec("weather", URL, {}, None, ALWAYS, None)
    assert spec.approval.needs_approval("anything")  # OpenAI's default


def test_full_entry() -> None:
    [spec] = parse_mcp_tools([mcp(headers={"X-Api-Key": "k1"}, allowed_tools=["a", "b"], require_approval="never",
                                  server_description="Weather data")])
    assert spec.headers == {"X-Api-Key": "k1"}
    assert spec.allowed_tools == frozenset({"a", "b"})
    assert spec.approval == NEVER and not spec.approval.needs_approval("a")
    assert spec.server_description == "Weather data"


def test_headers_are_not_in_repr() -> None:
    spec = parse_mcp_tool(mcp(headers={"Authorization": "Bearer s3cr3t"}))
    assert "s3cr3t" not in repr(spec) and "s3cr3t" not in str(spec)


def test_authorization_becomes_a_bearer_header() -> None:
    spec = parse_mcp_tool(mcp(authorization="tok"))
    assert spec.headers == {"Authorization": "Bearer tok"}
    refused(mcp(authorization="tok", headers={"authorization": "Basic x"}), "tools[0].authorization")


def test_allowed_tools_object_forms() -> None:
    assert parse_mcp_tool(mcp(allowed_tools={"tool_names": ["x"]})).allowed_tools == frozenset({"x"})
    spec = parse_mcp_tool(mcp(allowed_tools={"read_only": True, "tool_names": ["x", "y"]}))
    assert spec.allowed_tools == frozenset({"x", "y"}) and spec.allowed_read_only is True
    assert spec.allows("x", read_only_hint=True) and not spec.allows("x") and not spec.allows("z", True)
    assert parse_mcp_tool(mcp(allowed_tools={})).allows("anything")
    assert parse_mcp_tool(mcp(allowed_tools=[])).allowed_tools == frozenset()  # nothing allowed


def test_indices_come_from_the_request_tools() -> None:
    tools = [{"type": "function", "name": "f"}, mcp(server_label="a"), mcp(server_label="b", server_url="ftp://x")]
    refused(tools, "tools[2].server_url")
    # (index, entry) pairs, as the request model passes them
    with pytest.raises(OpenAIError) as info:
        parse_mcp_tools([(5, mcp(server_label="bad label"))])
    assert info.value.param == "tools[5].server_label"


def test_labels_are_unique() -> None:
    e = refused([mcp(), mcp(server_url="https://other.example.com/")], "tools[1].server_label")
    assert "Duplicate server_label 'weather'" in e.message


@pytest.mark.parametrize(("entry", "param"), [
    ({"type": "mcp", "server_url": URL}, "tools[0].server_label"),
    (mcp(server_label=""), "tools[0].server_label"),
    (mcp(server_label="a" * 65), "tools[0].server_label"),
    (mcp(server_label="has space"), "tools[0].server_label"),
    (mcp(server_label=3), "tools[0].server_label"),
    ({"type": "mcp", "server_label": "w"}, "tools[0].server_url"),
    (mcp(server_url="file:///etc/passwd"), "tools[0].server_url"),
    (mcp(server_url="http://"), "tools[0].server_url"),
    (mcp(server_url="http://user:pw@mcp.example.com/"), "tools[0].server_url"),
    (mcp(server_url="http://mcp.example.com:99999/"), "tools[0].server_url"),
    (mcp(server_url="https://x/" + "a" * 3000), "tools[0].server_url"),
    (mcp(headers=["x"]), "tools[0].headers"),
    (mcp(headers={"Bad Name": "v"}), "tools[0].headers"),
    (mcp(headers={"X-Key": 1}), "tools[0].headers.X-Key"),
    (mcp(headers={"X-Key": "a\r\nInjected: 1"}), "tools[0].headers.X-Key"),
    (mcp(headers={"Host": "evil.example"}), "tools[0].headers.Host"),
    (mcp(headers={"Mcp-Session-Id": "s"}), "tools[0].headers.Mcp-Session-Id"),
    (mcp(headers={"Content-Length": "1"}), "tools[0].headers.Content-Length"),
    (mcp(headers={"Accept-Encoding": "gzip"}), "tools[0].headers.Accept-Encoding"),  # answers are counted raw
    (mcp(allowed_tools="x"), "tools[0].allowed_tools"),
    (mcp(allowed_tools=["x", ""]), "tools[0].allowed_tools[1]"),
    (mcp(allowed_tools={"tool_names": "x"}), "tools[0].allowed_tools.tool_names"),
    (mcp(allowed_tools={"read_only": "yes"}), "tools[0].allowed_tools.read_only"),
    (mcp(allowed_tools={"names": ["x"]}), "tools[0].allowed_tools.names"),
    (mcp(require_approval="sometimes"), "tools[0].require_approval"),
    (mcp(require_approval=True), "tools[0].require_approval"),
    (mcp(require_approval={"maybe": {}}), "tools[0].require_approval.maybe"),
    (mcp(require_approval={"always": ["x"]}), "tools[0].require_approval.always"),
    (mcp(require_approval={"always": {"tool_names": ["x"]}, "never": {"tool_names": ["x"]}}),
     "tools[0].require_approval"),
    (mcp(server_description=1), "tools[0].server_description"),
    (mcp(connector_id="connector_gmail"), "tools[0].connector_id"),
    (mcp(surprise=1), "tools[0].surprise"),
])
def test_bad_entries(entry: dict[str, Any], param: str) -> None:
    refused(entry, param)


def test_messages_never_hold_header_values() -> None:
    e = refused(mcp(headers={"X-Key": "s3cr3t\n"}), "tools[0].headers.X-Key")
    assert "s3cr3t" not in e.message


# ---- approval ---------------------------------------------------------------------------------------


def test_approval_object_form() -> None:
    spec = parse_mcp_tool(mcp(require_approval={"never": {"tool_names": ["read"]},
                                                "always": {"tool_names": ["delete"]}}))
    assert not spec.approval.needs_approval("read")
    assert spec.approval.needs_approval("delete")
    assert spec.approval.needs_approval("other")  # unnamed: the default, always


def test_approval_read_only_filters() -> None:
    policy = parse_mcp_tool(mcp(require_approval={"never": {"read_only": True}})).approval
    assert not policy.needs_approval("get", read_only_hint=True)
    assert policy.needs_approval("put", read_only_hint=False)
    assert policy.needs_approval("unannotated")
    # where both filters match, "always" wins
    both = ApprovalPolicy(True, ToolFilter(frozenset({"get"})), ToolFilter(read_only=True))
    assert both.needs_approval("get", read_only_hint=True)


# ---- function names -----------------------------------------------------------------------------------


def spec(label: str, **kw: Any) -> McpServerSpec:
    return parse_mcp_tool(mcp(server_label=label, **kw))


def tools(*names: str) -> list[dict[str, Any]]:
    return [ListedTool(n, f"does {n}", {"type": "object", "properties": {"q": {"type": "string"}}}).as_dict()
            for n in names]


def test_function_name_round_trip() -> None:
    s = spec("weather")
    assert function_name(s, "lookup") == "weather__lookup"
    assert parse_function_name("weather__lookup") == ("weather", "lookup")
    assert parse_function_name("lookup") is None
    assert parse_function_name("my__srv__lookup", labels=["my", "my__srv"]) == ("my__srv", "lookup")
    assert parse_function_name("other__lookup", labels=["my"]) is None


def test_directory_plain_names_when_unique() -> None:
    d = ToolDirectory()
    d.add(spec("weather"), tools("lookup_weather", "forecast"))
    d.add(spec("maps"), tools("route"))
    assert {t["name"] for t in d.function_tools()} == {"lookup_weather", "forecast", "route"}
    assert d.resolve("route") == ("maps", "route")
    assert d.resolve("nope") is None
    [fn] = [t for t in d.function_tools() if t["name"] == "route"]
    assert fn == {"type": "function", "name": "route", "description": "does route",
                  "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}


def test_directory_qualifies_clashing_names() -> None:
    d = ToolDirectory(reserved=["route"])  # the request's own function tool
    d.add(spec("a"), tools("search", "only_a"))
    d.add(spec("b"), tools("search", "route"))
    names = {t["name"] for t in d.function_tools()}
    assert names == {"a__search", "b__search", "only_a", "b__route"}
    assert d.resolve("a__search") == ("a", "search") and d.resolve("b__search") == ("b", "search")
    assert d.resolve("b__route") == ("b", "route") and d.resolve("route") is None
    assert d.function_name("b", "search") == "b__search"


def test_directory_filters_by_allowed_tools() -> None:
    d = ToolDirectory()
    d.add(spec("w", allowed_tools=["keep"]), tools("keep", "drop"))
    ro = [{"name": "get", "annotations": {"readOnlyHint": True}}, {"name": "put", "annotations": {}}]
    d.add(spec("r", allowed_tools={"read_only": True}), ro)
    assert {t["name"] for t in d.function_tools()} == {"keep", "get"}
    [get] = [t for t in d.function_tools() if t["name"] == "get"]
    assert get["parameters"] == {"type": "object", "properties": {}} and get["description"] == ""


def test_directory_targets_carry_approval() -> None:
    d = ToolDirectory()
    d.add(spec("w", require_approval={"never": {"read_only": True}}),
          [{"name": "get", "annotations": {"readOnlyHint": True}}, {"name": "put"}])
    assert d.target("get") == ("w", "get", False)
    assert d.target("put") == ("w", "put", True)
    assert d.target("other") is None


def test_unusual_tool_names_get_valid_stable_function_names() -> None:
    long = "x" * 100
    d = ToolDirectory()
    d.add(spec("a"), tools("files/read", "files.read", long))
    names = [t["name"] for t in d.function_tools()]
    assert len(set(names)) == 3
    assert all(re.match(FUNCTION_NAME_PATTERN, n) for n in names), names
    for name in names:
        assert d.resolve(name) is not None
    again = ToolDirectory()
    again.add(spec("a"), reversed(tools("files/read", "files.read", long)))
    assert sorted(t["name"] for t in again.function_tools()) == sorted(names)  # the same on every turn


def test_directory_keeps_first_of_a_duplicate_and_accepts_listed_tools() -> None:
    d = ToolDirectory()
    d.add(spec("a"), [ListedTool("t", "first"), ListedTool("t", "second")])
    assert d.function_tools()[0]["description"] == "first"
    assert d.tool("a", "t") == ListedTool("t", "first")
