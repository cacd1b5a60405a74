"""The state service's pure rules: key encoding, input-item paging, event shapes."""

from __future__ import annotations

import pytest

from mship.state.v1 import state_pb2 as pb
from services.common.errors import ServiceError
from services.state import runs
from services.state.backends import open_store
from services.state.servicer import page_items
from services.state.store import key_path, parse_key_path
from tests.store_contract import ev


def test_key_parts_are_encoded_so_identities_never_collide():
    assert key_path("a/b", "c") != key_path("a", "b/c")
    assert parse_key_path(key_path("a/b", "c%2F")) == ("a/b", "c%2F")


def test_input_items_pages_like_the_api():
    items = [pb.InputItem(id=f"i{n}") for n in range(5)]
    first = page_items(items, 2, pb.LIST_ORDER_UNSPECIFIED, "")  # desc by default
    assert [i.id for i in first.data] == ["i4", "i3"] and first.has_more and first.last_id == "i3"
    rest = page_items(items, 10, pb.LIST_ORDER_DESC, first.last_id)
    assert [i.id for i in rest.data] == ["i2", "i1", "i0"] and not rest.has_more
    asc = page_items(items, 2, pb.LIST_ORDER_ASC, "i2")
    assert [i.id for i in asc.data] == ["i3", "i4"] and not asc.has_more and asc.first_id == "i3"
    with pytest.raises(ServiceError) as info:
        page_items(items, 2, pb.LIST_ORDER_ASC, "nope")
    assert info.value.field_violations[0][0] == "after"


def test_event_shape_rules():
    assert runs.validate_events([ev(1), ev(2)], "events", allow_terminal=False) == []
    assert runs.validate_events([ev(1), ev(3)], "events", allow_terminal=False)[0][0] == "events[1].sequence"
    assert runs.validate_events([ev(1), ev(0)], "events", allow_terminal=False)[0][0] == "events"
    assert runs.validate_events([ev(1, terminal=True)], "events", allow_terminal=False)
    assert runs.validate_events([ev(1, terminal=True), ev(2)], "events", allow_terminal=True)
    assert runs.validate_events([ev(1), ev(2, terminal=True)], "events", allow_terminal=True) == []


def test_password_never_in_the_url():
    with pytest.raises(ValueError, match="MSHIP_REDIS_PASSWORD"):
        open_store("redis://:hunter2@127.0.0.1:6390/0")
    with pytest.raises(ValueError, match="unknown state store"):
        open_store("postgres://x")
