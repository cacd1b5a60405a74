"""What chat and responses requests both choose from: content-part refusals, response formats
(`text`, `json_object`, the endpoint's own `json_schema` form) and tool-choice modes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.protocol_common.validation import Str, WireModel, bad_value, by_field, invalid, missing, tagged

NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for function and json_schema names
FunctionName = Annotated[Str, Field(pattern=NAME_PATTERN)]

TOOL_MODES = {None: pb.TOOL_CHOICE_MODE_UNSPECIFIED, "auto": pb.TOOL_CHOICE_MODE_AUTO,
              "none": pb.TOOL_CHOICE_MODE_NONE, "required": pb.TOOL_CHOICE_MODE_REQUIRED}


def content_part(kinds: Mapping[str, Any], allowed: tuple[str, ...], unsupported: Mapping[str, str]) -> Any:
    """A content part of one of the `allowed` types (`kinds`: type -> model). Any other type is
    refused: what this server cannot take (`unsupported`: type -> what it is) says so, anything
    else lists the `allowed` types."""
    def check(value: dict[str, Any]) -> Any:
        kind = value.get("type")
        if kind is None:
            raise missing("type")
        if kind in unsupported:
            raise invalid("type", f"{unsupported[kind]} ('{kind}' content parts) is not supported by this "
                          "server.", kind)
        raise bad_value("type", kind, allowed)
    return tagged(by_field("type", allowed), {**{k: kinds[k] for k in allowed},
                                              "other": Annotated[Any, PlainValidator(check)]}, "an object")


class TextFormat(WireModel):
    type: Literal["text"]


class JSONObjectFormat(WireModel):
    type: Literal["json_object"]


FORMATS = ("text", "json_object", "json_schema")


def _refuse_format(value: dict[str, Any]) -> Any:
    raise missing("type") if value.get("type") is None else bad_value("type", value["type"], FORMATS)


def response_format(json_schema: type[WireModel]) -> Any:
    """The response-format union, with the endpoint's `json_schema` model."""
    return tagged(by_field("type", FORMATS), {
        "text": TextFormat, "json_object": JSONObjectFormat, "json_schema": json_schema,
        "other": Annotated[Any, PlainValidator(_refuse_format)]}, "an object")
