"""Image input on the real platform: `builtin:tiny-vlm` (Idefics3 on vLLM, trained to describe one
coloured shape) deployed beside the session's text model `tiny`.

An image chat to the vision model completes with the trained description; the same request to the
text-only model is refused at the edge with a 400 naming the image part; the Open Responses
compliance suite's `image-input` request (text, then a red heart icon as a data: URL) completes on
the vision model, and its response object passes the Open Responses schema."""

from __future__ import annotations

import base64
import io
import json
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.worker.builtin import tiny_vlm
from tests.integration.conftest import PLATFORM_MODELS, TINY
from tests.openresponses import check_response
from tests.platform_process import PlatformProcess, mship

pytestmark = pytest.mark.integration
VLM = "tiny-vlm"
def data_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


RED_SQUARE = data_url(tiny_vlm.draw("red", "square", random.Random(7), size=(64, 64)))


def heart_icon() -> str:
    """Like the Open Responses compliance suite's `image-input` picture (openresponses/openresponses,
    src/lib/compliance-tests.ts: "a red heart icon on a white background", a 32x32 PNG), drawn here."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (32, 32), (255, 255, 255))
    d = ImageDraw.Draw(img)
    d.ellipse((4, 6, 17, 19), fill=(220, 20, 40))
    d.ellipse((15, 6, 28, 19), fill=(220, 20, 40))
    d.polygon([(5, 15), (27, 15), (16, 28)], fill=(220, 20, 40))
    return data_url(img)


def http(platform: PlatformProcess) -> httpx.Client:
    return httpx.Client(base_url=f"{platform.base_url}/v1", headers={"authorization": f"Bearer {platform.api_key}"},
                        timeout=180)


@pytest.fixture(scope="module")
def vlm(platform: PlatformProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`tiny-vlm` beside the session's models (an additive deploy), reconciled away afterwards."""
    home = Path(tmp_path_factory.mktemp("vision"))
    (home / "vlm.yaml").write_text(f"models:\n  - name: {VLM}\n    model: builtin:tiny-vlm\n"
                                   "    max_model_len: 512\n    max_num_seqs: 2\n    num_cpus: 0.5\n")
    out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(home / "vlm.yaml"), "--wait")
    assert out.returncode == 0, out.stdout + out.stderr
    yield VLM
    (home / "session.yaml").write_text(PLATFORM_MODELS)
    out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(home / "session.yaml"),
                "--reconcile", "--wait")
    assert out.returncode == 0, out.stdout + out.stderr


def image_chat(model: str, url: str = RED_SQUARE, **extra) -> dict:
    return {"model": model, "temperature": 0, "max_tokens": 32, **extra, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                     {"type": "text", "text": "Describe the image."}]}]}


def test_an_image_chat_to_the_vision_model_gets_the_trained_description(platform, vlm):
    with http(platform) as c:
        r = c.post("/chat/completions", json=image_chat(vlm))
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert (choice["message"]["content"], choice["finish_reason"]) == ("A red square.", "stop")
        assert r.json()["usage"]["prompt_tokens"] > 7  # the image's tokens count as prompt
        with c.stream("POST", "/chat/completions", json=image_chat(vlm, stream=True)) as s:
            assert s.status_code == 200
            chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
        text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
        assert text == "A red square."
        r = c.post("/chat/completions", json={"model": vlm, "temperature": 0, "max_tokens": 32,
                                              "messages": [{"role": "user", "content": "Hello!"}]})
        assert r.json()["choices"][0]["message"]["content"] == tiny_vlm.TEXT_ONLY_ANSWER


def test_a_text_model_refuses_image_parts_with_a_400_naming_the_part(platform, vlm):
    with http(platform) as c:
        r = c.post("/chat/completions", json=image_chat(TINY))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["code"]) == ("messages[0].content[0]", "image_input_not_supported")
        assert TINY in error["message"]
        r = c.post("/responses", json={"model": TINY, "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": RED_SQUARE}]}]})
        assert r.status_code == 400, r.text
        assert "image" in r.json()["error"]["message"]


def test_the_vision_model_takes_data_urls_only(platform, vlm):
    with http(platform) as c:
        r = c.post("/chat/completions", json=image_chat(vlm, url="https://example.com/cat.png"))
        assert r.status_code == 400, r.text
        assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("messages[0].content[0]",
                                                                           "invalid_image_url")


def test_the_open_responses_image_input_check_passes_on_the_vision_model(platform, vlm):
    body = {"model": vlm, "input": [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "What do you see in this image? Answer in one sentence."},
        {"type": "input_image", "image_url": heart_icon()}]}]}
    with http(platform) as c:
        r = c.post("/responses", json=body)
    assert r.status_code == 200, r.text
    response = r.json()
    check_response(response)  # the Open Responses ResponseResource schema and the SDK's type
    assert response["status"] == "completed" and response["output"], response  # the suite's validators
    text = "".join(p["text"] for i in response["output"] if i["type"] == "message" for p in i["content"])
    assert text.startswith("A ") and text.endswith("."), text  # a description, in one sentence
