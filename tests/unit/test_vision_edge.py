"""Image input at the edge: image parts are found in chat and Responses requests, a text-only model
refuses them with a 400 naming the part, a vision model gets bounded data: URLs only, and the
capability travels replica -> registry snapshot -> the gateway's route table."""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.common import images as image_bounds
from services.common.images import image_problem
from services.common.routes import Route, RouteTable
from services.coordinator.registry import ActiveModel, ReplicaRegistry
from services.gateway.chat.protocol import image_parts, parse_chat_request, to_infer_request
from services.gateway.chat.serving import ChatServing
from services.gateway.protocol_common import images
from services.gateway.protocol_common.images import check_image_input
from services.gateway.protocol_common.openai_error import OpenAIError
from services.gateway.responses.protocol import parse_response_request


def png(size: tuple[int, int] = (8, 8), colour: tuple[int, int, int] = (255, 0, 0)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


RED = png()


def chat_body(model: str = "m", url: str = RED) -> dict:
    return {"model": model, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Describe the image."},
                                     {"type": "image_url", "image_url": {"url": url}}]}]}


def test_chat_image_parts_are_named_by_their_place_and_reach_the_worker_request():
    req = parse_chat_request(chat_body())
    assert image_parts(req) == [("messages[1].content[1]", RED)]
    infer = to_infer_request(req, request_id="r", cache_salt=None)
    parts = infer.chat.messages[1].parts.parts
    assert [p.WhichOneof("part") for p in parts] == ["text", "image_url"] and parts[1].image_url == RED
    assert image_parts(parse_chat_request({"model": "m", "messages": [{"role": "user", "content": "hi"}]})) == []


def test_responses_input_image_parts_are_named_by_their_place():
    req = parse_response_request({"model": "m", "input": [
        {"role": "user", "content": "first"},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "What do you see?"}, {"type": "input_image", "image_url": RED}]},
        {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": RED}]}]})
    assert req.image_parts() == [("input[1].content[1]", RED), ("input[2].output[0]", RED)]
    assert parse_response_request({"model": "m", "input": "hi"}).image_parts() == []


def test_a_text_only_model_refuses_image_parts_with_a_400_naming_the_part():
    with pytest.raises(OpenAIError) as e:
        check_image_input("text-model", False, [("messages[0].content[1]", RED)])
    assert e.value.status == 400 and e.value.param == "messages[0].content[1]"
    assert e.value.code == "image_input_not_supported" and "text-model" in e.value.message
    check_image_input("text-model", False, [])  # no image: nothing to refuse


def test_a_vision_model_or_an_unknown_one_takes_bounded_data_urls_only():
    check_image_input("vlm", True, [("messages[0].content[0]", RED)])
    check_image_input("vlm", None, [("messages[0].content[0]", RED)])  # not known yet: the worker decides
    with pytest.raises(OpenAIError) as e:
        check_image_input("vlm", True, [("messages[0].content[0]", RED), ("messages[0].content[1]", "https://x/y.png")])
    assert (e.value.status, e.value.param, e.value.code) == (400, "messages[0].content[1]", "invalid_image_url")
    assert "data: URL" in e.value.message
    with pytest.raises(OpenAIError) as e:
        check_image_input("vlm", True, [(f"messages[0].content[{i}]", RED) for i in range(images.MAX_IMAGES + 1)])
    assert e.value.param == f"messages[0].content[{images.MAX_IMAGES}]" and e.value.code == "too_many_images"


@pytest.mark.parametrize(("url", "says"), [
    ("http://example.com/cat.png", "not fetched"),
    ("file:///etc/passwd", "expected a base64 data: URL"),
    ("data:text/plain;base64,aGk=", "of an image"),
    ("data:image/png,rawbytes", "of an image"),
    ("data:image/png;base64,@@@@", "not valid base64"),
    ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "not a readable image"),
])
def test_bad_image_urls_say_why(url: str, says: str):
    problem = image_problem(url)
    assert problem is not None and says in problem


def test_image_bounds_bytes_and_pixels(monkeypatch: pytest.MonkeyPatch):
    assert image_problem(RED) is None
    monkeypatch.setattr(image_bounds, "MAX_IMAGE_PIXELS", 63)
    assert "8x8 pixels" in (image_problem(RED) or "")
    monkeypatch.setattr(image_bounds, "MAX_IMAGE_BYTES", 10)
    assert "at most 10 bytes" in (image_problem(RED) or "")


def test_chat_serving_refuses_before_any_worker_call_by_the_routes_capability():
    table = RouteTable()
    table.routes["text"] = Route("text", "v1", 512, common_pb2.USECASE_GENERATE, accepts_images=False)
    table.routes["vlm"] = Route("vlm", "v1", 512, common_pb2.USECASE_GENERATE, accepts_images=True)
    serving = ChatServing(table)
    with pytest.raises(OpenAIError) as e:
        serving.call(json.dumps(chat_body("text")).encode())
    assert (e.value.status, e.value.param) == (400, "messages[1].content[1]")
    assert serving.call(json.dumps(chat_body("vlm")).encode()).model == "vlm"
    assert serving.call(json.dumps(chat_body("unknown")).encode()).model == "unknown"  # 404 later


def test_route_table_keeps_the_capability_unset_until_known():
    table = RouteTable()
    snap = pb.RoutingSnapshot(version=1, models=[pb.ModelRoute(name="a", version="v"),
                                                 pb.ModelRoute(name="b", version="v", accepts_images=True),
                                                 pb.ModelRoute(name="c", version="v", accepts_images=False)])
    table.apply(snap)
    assert [table.routes[n].accepts_images for n in "abc"] == [None, True, False]


def _replica(rid: str, vision: bool) -> pb.ReplicaInfo:
    return pb.ReplicaInfo(replica_id=rid, model="vlm", version="v1", accepts_images=vision,
                          endpoint=common_pb2.Endpoint(host="127.0.0.1", port=1))


async def test_the_registry_routes_what_the_replicas_said_and_remembers_it_at_zero_replicas():
    registry = ReplicaRegistry()
    spec = common_pb2.ModelSpec(name="vlm")
    spec.autoscaling.CopyFrom(common_pb2.AutoscalingConfig(min_replicas=0, max_replicas=1))
    await registry.set_active("vlm", ActiveModel.of(spec, "v1"))
    assert not registry.snapshot().models[0].HasField("accepts_images")  # never seen: unknown
    await registry.register(_replica("a", True))
    assert registry.snapshot().models[0].accepts_images is True
    await registry.unregister("a")  # scaled to zero: still known
    route = registry.snapshot().models[0]
    assert (list(route.replicas), route.HasField("accepts_images"), route.accepts_images) == ([], True, True)
    await registry.set_active("vlm", None)
    assert registry._vision == {}  # a retired model is forgotten


async def test_a_text_replica_routes_as_text_only():
    registry = ReplicaRegistry()
    await registry.set_active("vlm", ActiveModel("v1", common_pb2.USECASE_GENERATE))
    await registry.register(_replica("a", False))
    route = registry.snapshot().models[0]
    assert route.HasField("accepts_images") and route.accepts_images is False
