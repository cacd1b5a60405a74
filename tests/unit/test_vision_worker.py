"""The worker's side of image input (no engine): a vision engine gets image parts only as bounded
base64 data: URLs -- it fetches nothing -- refused otherwise as INVALID_PARAMETER naming the part
(the bounds themselves: services/common/images.py, tested in test_vision_edge.py); a model without
a multimodal config is text-only."""

from __future__ import annotations

import base64
import io
from types import SimpleNamespace

import grpc
import pytest
from PIL import Image

from services.common.errors import ServiceError
from services.worker.vllm_engine import accepts_images, check_images


def png(size: tuple[int, int] = (8, 8)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, (0, 0, 255)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat(url: str) -> list[dict]:
    return [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Describe the image."},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


def test_a_data_url_image_passes():
    check_images(chat(png()))
    check_images([{"role": "user", "content": "plain text"}])


@pytest.mark.parametrize(("url", "says"), [
    ("https://example.com/a.png", "not fetched"),
    ("data:text/plain;base64,aGk=", "of an image"),
    ("data:image/png;base64,!!!!", "not valid base64"),
])
def test_anything_else_is_refused_naming_the_part(url: str, says: str):
    with pytest.raises(ServiceError) as e:
        check_images(chat(url))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.field_violations[0][0] == "messages[1].content[1]"
    assert says in e.value.message


def test_a_model_without_a_multimodal_config_takes_no_images():
    assert accepts_images(SimpleNamespace(multimodal_config=None)) is False
    no_images = SimpleNamespace(get_limit_per_prompt=lambda modality: 0)
    assert accepts_images(SimpleNamespace(multimodal_config=no_images)) is False
