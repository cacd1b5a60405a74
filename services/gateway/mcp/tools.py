"""The `{"type": "mcp", ...}` entries of a request's `tools`, checked (`parse_mcp_tools`), and how
the servers' tools are offered to the model as function tools (`ToolDirectory`).

Shapes follow OpenAI's remote MCP tool: `allowed_tools` is a list of names or a filter
`{"tool_names": [...], "read_only": bool}`; `require_approval` is "always", "never" or
`{"always": filter, "never": filter}`. A filter with no conditions matches every tool; `read_only`
matches on the tool's `readOnlyHint` annotation (unannotated tools are not read-only)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from services.gateway.protocol_common.openai_error import OpenAIError, invalid_request

LABEL_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"  # what a model's function tool may be called
SEPARATOR = "__"  # between server_label and tool in a qualified function name
MAX_URL, MAX_HEADERS, MAX_HEADER_VALUE = 2048, 64, 8192
_LABEL, _FUNCTION_NAME = re.compile(LABEL_PATTERN), re.compile(FUNCTION_NAME_PATTERN)
_NOT_NAME_CHAR = re.compile(r"[^a-zA-Z0-9_-]")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")  # an RFC 9110 token
_BAD_HEADER_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# Framing, the connection and the MCP session are the transport's; `Host` must match the URL the
# egress policy checked; answers are uncompressed (the client counts their bytes). None of them
# may come from the request.
_RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "upgrade", "te",
                               "trailer", "keep-alive", "content-type", "accept", "accept-encoding",
                               "last-event-id"})
_RESERVED_PREFIXES = ("mcp-", "proxy-")
_KEYS = ("type", "server_label", "server_url", "headers", "authorization", "allowed_tools", "require_approval",
         "server_description")
_FILTER_KEYS = ("tool_names", "read_only")


# ---- the spec of one server ----------------------------------------------------------------------


@dataclass(frozen=True)
class ToolFilter:
    """OpenAI's `McpToolFilter`: every condition given must hold."""

    tool_names: frozenset[str] | None = None  # None: any name
    read_only: bool | None = None  # None: read-only or not

    def matches(self, tool_name: str, read_only_hint: bool | None = None) -> bool:
        if self.tool_names is not None and tool_name not in self.tool_names:
            return False
        return self.read_only is None or bool(read_only_hint) == self.read_only


@dataclass(frozen=True)
class ApprovalPolicy:
    # OpenAI's default is "always": every call waits for the user's approval unless the request
    # says otherwise, also for tools the object form does not name. Kept, so a client written for
    # OpenAI is never surprised by a call it did not approve.
    default: bool = True
    always: ToolFilter | None = None
    never: ToolFilter | None = None

    def needs_approval(self, tool_name: str, read_only_hint: bool | None = None) -> bool:
        # "always" wins over "never" where both match (read_only filters can overlap): the safe side.
        if self.always is not None and self.always.matches(tool_name, read_only_hint):
            return True
        if self.never is not None and self.never.matches(tool_name, read_only_hint):
            return False
        return self.default


ALWAYS, NEVER = ApprovalPolicy(True), ApprovalPolicy(False)


@dataclass(frozen=True)
class McpServerSpec:
    server_label: str
    server_url: str
    # Secrets (tokens): kept out of repr, so a logged spec never shows them.
    headers: dict[str, str] = field(default_factory=dict, repr=False, hash=False)
    allowed_tools: frozenset[str] | None = None  # None: every tool the server lists
    approval: ApprovalPolicy = ALWAYS
    server_description: str | None = None
    allowed_read_only: bool | None = None  # `allowed_tools: {"read_only": ...}`; None: no condition

    def allows(self, tool_name: str, read_only_hint: bool | None = None) -> bool:
        return ToolFilter(self.allowed_tools, self.allowed_read_only).matches(tool_name, read_only_hint)


@dataclass(frozen=True)
class ListedTool:
    """A tool as the server listed it; `as_dict()` is the `mcp_list_tools` item's entry."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}}, hash=False)
    annotations: dict[str, Any] | None = field(default=None, hash=False)  # MCP's wire names (readOnlyHint)

    @property
    def read_only_hint(self) -> bool | None:
        value = (self.annotations or {}).get("readOnlyHint")
        return value if isinstance(value, bool) else None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema,
                "annotations": self.annotations}

    @classmethod
    def from_dict(cls, tool: Mapping[str, Any]) -> ListedTool:
        schema = tool.get("input_schema")
        annotations = tool.get("annotations")
        return cls(str(tool["name"]), tool.get("description"),
                   dict(schema) if isinstance(schema, Mapping) else {"type": "object", "properties": {}},
                   dict(annotations) if isinstance(annotations, Mapping) else None)


# ---- parsing -------------------------------------------------------------------------------------


def parse_mcp_tools(tools: Iterable[Mapping[str, Any] | tuple[int, Mapping[str, Any]]]) -> list[McpServerSpec]:
    """The MCP servers of a request's `tools`, checked, labels unique. Entries are the tools
    themselves (index: their position) or `(index in tools, entry)` pairs, so that a `param` names
    the entry the client sent; entries of other types are skipped."""
    specs: list[McpServerSpec] = []
    seen: set[str] = set()
    for position, item in enumerate(tools):
        index, entry = item if isinstance(item, tuple) else (position, item)
        if not isinstance(entry, Mapping) or entry.get("type") != "mcp":
            continue
        spec = parse_mcp_tool(entry, index)
        if spec.server_label in seen:
            raise invalid_request(f"Duplicate server_label '{spec.server_label}': each MCP server in 'tools' needs "
                                  "a label of its own.", f"tools[{index}].server_label")
        seen.add(spec.server_label)
        specs.append(spec)
    return specs


def parse_mcp_tool(entry: Mapping[str, Any], index: int = 0) -> McpServerSpec:
    at = f"tools[{index}]"
    if entry.get("type") != "mcp":
        raise invalid_request(f"Invalid value for '{at}.type': expected 'mcp'.", f"{at}.type")
    for key in entry:
        if key == "connector_id":
            raise invalid_request("Service connectors ('connector_id') are not supported by this server: give the "
                                  "MCP server's 'server_url'.", f"{at}.connector_id")
        if key not in _KEYS:
            raise invalid_request(f"Unrecognized request argument supplied: {at}.{key}", f"{at}.{key}")
    label = _string(entry, "server_label", at, required=True)
    if not _LABEL.match(label):
        raise invalid_request(f"Invalid '{at}.server_label': string does not match pattern. Expected a string that "
                              f"matches the pattern '{LABEL_PATTERN}'.", f"{at}.server_label")
    description = _string(entry, "server_description", at)
    headers = _headers(entry.get("headers"), f"{at}.headers")
    token = _string(entry, "authorization", at)
    if token is not None:
        if any(k.lower() == "authorization" for k in headers):
            raise invalid_request(f"Give either '{at}.authorization' or an Authorization header in '{at}.headers', "
                                  "not both.", f"{at}.authorization")
        if _BAD_HEADER_VALUE.search(token) or not token.strip():
            raise invalid_request(f"Invalid '{at}.authorization': not a usable token.", f"{at}.authorization")
        headers["Authorization"] = f"Bearer {token.strip()}"
    allowed = _filter(entry.get("allowed_tools"), f"{at}.allowed_tools", list_ok=True)
    return McpServerSpec(label, _url(_string(entry, "server_url", at, required=True), f"{at}.server_url"), headers,
                         None if allowed is None else allowed.tool_names, _approval(entry, at), description,
                         None if allowed is None else allowed.read_only)


def _string(entry: Mapping[str, Any], key: str, at: str, required: bool = False) -> Any:
    value = entry.get(key)
    if value is None:
        if required:
            raise invalid_request(f"Missing required parameter: '{at}.{key}'.", f"{at}.{key}")
        return None
    if not isinstance(value, str):
        raise _type_error(f"{at}.{key}", "a string", value)
    return value


def _type_error(param: str, expected: str, value: Any) -> OpenAIError:
    got = {bool: "a boolean", int: "an integer", float: "a decimal", str: "a string", list: "an array",
           dict: "an object"}.get(type(value), "an unknown type")
    return invalid_request(f"Invalid type for '{param}': expected {expected}, but got {got} instead.", param)


def _url(url: str, param: str) -> str:
    url = url.strip()
    if len(url) > MAX_URL:
        raise invalid_request(f"Invalid '{param}': longer than {MAX_URL} characters.", param)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a bad port
    except ValueError:
        raise invalid_request(f"Invalid '{param}': not a valid URL.", param) from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise invalid_request(f"Invalid '{param}': expected an http:// or https:// URL of an MCP server's "
                              "streamable HTTP endpoint.", param)
    if parts.username is not None or parts.password is not None:
        raise invalid_request(f"Invalid '{param}': the URL must not carry credentials; send them in 'headers' or "
                              "'authorization'.", param)
    return url


def _headers(value: Any, param: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _type_error(param, "an object", value)
    if len(value) > MAX_HEADERS:
        raise invalid_request(f"Invalid '{param}': at most {MAX_HEADERS} headers.", param)
    headers: dict[str, str] = {}
    for name, v in value.items():
        # Messages name the header, never its value: values are secrets.
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise invalid_request(f"Invalid '{param}': {name!r} is not a valid HTTP header name.", param)
        lower = name.lower()
        if lower in _RESERVED_HEADERS or lower.startswith(_RESERVED_PREFIXES):
            raise invalid_request(f"Invalid '{param}': the header '{name}' is set by the server itself and cannot "
                                  "be given.", f"{param}.{name}")
        if not isinstance(v, str):
            raise _type_error(f"{param}.{name}", "a string", v)
        if len(v) > MAX_HEADER_VALUE or _BAD_HEADER_VALUE.search(v):
            raise invalid_request(f"Invalid '{param}.{name}': the value is too long or holds control characters.",
                                  f"{param}.{name}")
        headers[name] = v
    return headers


def _names(value: Any, param: str) -> frozenset[str]:
    if not isinstance(value, list):
        raise _type_error(param, "an array of strings", value)
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name:
            raise invalid_request(f"Invalid '{param}[{i}]': expected a tool name (a non-empty string).",
                                  f"{param}[{i}]")
    return frozenset(value)


def _filter(value: Any, param: str, list_ok: bool = False) -> ToolFilter | None:
    if value is None:
        return None
    if list_ok and isinstance(value, list):
        return ToolFilter(_names(value, param))
    if not isinstance(value, Mapping):
        raise _type_error(param, "an array of tool names or an object" if list_ok else "an object", value)
    for key in value:
        if key not in _FILTER_KEYS:
            raise invalid_request(f"Unrecognized request argument supplied: {param}.{key}", f"{param}.{key}")
    names = value.get("tool_names")
    read_only = value.get("read_only")
    if read_only is not None and not isinstance(read_only, bool):
        raise _type_error(f"{param}.read_only", "a boolean", read_only)
    return ToolFilter(None if names is None else _names(names, f"{param}.tool_names"), read_only)


def _approval(entry: Mapping[str, Any], at: str) -> ApprovalPolicy:
    value, param = entry.get("require_approval"), f"{at}.require_approval"
    if value is None or value == "always":
        return ALWAYS
    if value == "never":
        return NEVER
    if isinstance(value, str):
        raise invalid_request(f"Invalid value: {value!r}. Supported values are: 'always', 'never'.", param)
    if not isinstance(value, Mapping):
        raise _type_error(param, "'always', 'never' or an object", value)
    for key in value:
        if key not in ("always", "never"):
            raise invalid_request(f"Unrecognized request argument supplied: {param}.{key}", f"{param}.{key}")
    always, never = _filter(value.get("always"), f"{param}.always"), _filter(value.get("never"), f"{param}.never")
    both = (always.tool_names or frozenset()) & (never.tool_names or frozenset()) if always and never else None
    if both:
        raise invalid_request(f"Invalid '{param}': the tools {sorted(both)} are in both 'always' and 'never'.", param)
    return ApprovalPolicy(True, always, never)


# ---- the servers' tools as the model's function tools -------------------------------------------


def _exposed(name: str) -> str:
    """`name` if a model may call a function so; else a stable stand-in that may (MCP tool names
    may hold dots or slashes and be 128 characters long)."""
    if _FUNCTION_NAME.match(name):
        return name
    clean = _NOT_NAME_CHAR.sub("_", name) or "_"
    if len(clean) <= 64:
        return clean  # a clash with another name is the directory's to settle
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{clean[:55]}_{digest}"


def function_name(spec: McpServerSpec, tool_name: str) -> str:
    """The qualified function name of a server's tool, `<server_label>__<tool>`: what the model is
    offered when the plain tool name is taken (`ToolDirectory` decides)."""
    return _exposed(f"{spec.server_label}{SEPARATOR}{tool_name}")


def parse_function_name(name: str, labels: Iterable[str] | None = None) -> tuple[str, str] | None:
    """(server_label, tool) of a qualified function name; with `labels`, only one of those (the
    longest that fits: labels may hold "__" themselves). A stand-in `_exposed` made for an unusual
    tool name cannot be parsed back: `ToolDirectory.resolve` maps every name it offered."""
    if labels is None:
        label, sep, tool = name.partition(SEPARATOR)
        return (label, tool) if sep and label and tool else None
    for label in sorted(labels, key=len, reverse=True):
        prefix = f"{label}{SEPARATOR}"
        if name.startswith(prefix) and len(name) > len(prefix):
            return label, name[len(prefix):]
    return None


class ToolDirectory:
    """The MCP tools offered to the model: exposed function name <-> (server_label, tool name).

    A tool keeps its plain name when no other server's tool (and none of `reserved`: the request's
    own function tools) is exposed so; else it is `<server_label>__<tool>`. Names depend only on
    the set of tools, so every turn of a conversation offers the same names."""

    def __init__(self, reserved: Iterable[str] = ()) -> None:
        self._reserved = frozenset(reserved)
        self._servers: dict[str, tuple[McpServerSpec, dict[str, ListedTool]]] = {}
        self._by_name: dict[str, tuple[str, str]] | None = None

    def add(self, spec: McpServerSpec, tools: Iterable[Mapping[str, Any] | ListedTool]) -> None:
        """A server's listed tools (`mcp_list_tools` entries or `ListedTool`s), filtered by its
        `allowed_tools`; a name listed twice keeps its first entry."""
        kept: dict[str, ListedTool] = {}
        for tool in tools:
            listed = tool if isinstance(tool, ListedTool) else ListedTool.from_dict(tool)
            if listed.name not in kept and spec.allows(listed.name, listed.read_only_hint):
                kept[listed.name] = listed
        self._servers[spec.server_label] = (spec, kept)
        self._by_name = None

    def _names(self) -> dict[str, tuple[str, str]]:
        if self._by_name is not None:
            return self._by_name
        entries = sorted((label, tool) for label, (_, tools) in self._servers.items() for tool in tools)
        plain_count: dict[str, int] = {}
        for _, tool in entries:
            plain_count[_exposed(tool)] = plain_count.get(_exposed(tool), 0) + 1
        taken = set(self._reserved)
        by_name: dict[str, tuple[str, str]] = {}
        for label, tool in entries:  # unique plain names first, so a qualified one never takes them
            plain = _exposed(tool)
            if plain_count[plain] == 1 and plain not in self._reserved:
                by_name[plain] = (label, tool)
                taken.add(plain)
        named = set(by_name.values())
        for label, tool in entries:
            if (label, tool) in named:
                continue
            name, n = _exposed(f"{label}{SEPARATOR}{tool}"), 0
            while name in taken:  # a clash left after qualifying (a stand-in, a reserved name)
                n += 1
                name = _exposed(f"{label}{SEPARATOR}{tool}#{n}")
            by_name[name] = (label, tool)
            taken.add(name)
        self._by_name = by_name
        return by_name

    def resolve(self, name: str) -> tuple[str, str] | None:
        """(server_label, MCP tool name) of an exposed function name, or None: not an MCP tool."""
        return self._names().get(name)

    def function_name(self, server_label: str, tool_name: str) -> str | None:
        for name, target in self._names().items():
            if target == (server_label, tool_name):
                return name
        return None

    def tool(self, server_label: str, tool_name: str) -> ListedTool | None:
        server = self._servers.get(server_label)
        return None if server is None else server[1].get(tool_name)

    def target(self, name: str) -> tuple[str, str, bool] | None:
        """(server_label, tool, whether the call needs the user's approval) of an exposed name."""
        found = self.resolve(name)
        if found is None:
            return None
        label, tool = found
        spec, tools = self._servers[label]
        return label, tool, spec.approval.needs_approval(tool, tools[tool].read_only_hint)

    def function_tools(self) -> list[dict[str, Any]]:
        """The OpenAI function tools for the model, in a stable order."""
        out = []
        for name, (label, tool) in sorted(self._names().items(), key=lambda kv: kv[1]):
            listed = self._servers[label][1][tool]
            out.append({"type": "function", "name": name, "description": listed.description or "",
                        "parameters": listed.input_schema})
        return out
