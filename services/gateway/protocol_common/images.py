"""Image input at the edge: which image parts a request holds, and whether its model may take them.

A vision model (its replicas say so at registration: `Route.accepts_images`) receives image parts as
base64 `data:image/...` URLs of bounded size; a text-only model refuses any image part with a 400
naming the part (`messages[0].content[1]`, `input[0].content[1]`). The gateway fetches no http(s)
image URL (no egress policy covers images): such a part is refused with a 400 saying to send a data:
URL. While a model's capability is not known yet (no replica registered), the worker decides.
Pure: no FastAPI, Starlette or gRPC.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.images import image_problem
from services.gateway.protocol_common.openai_error import OpenAIError

MAX_IMAGES = 16  # per request

ImageParts = Sequence[tuple[str, str]]  # (param, url) of each image part, in request order


def check_image_input(model: str, accepts_images: bool | None, parts: ImageParts) -> None:
    """400 (OpenAIError naming the part) unless every image part may go to `model`.

    `accepts_images`: the route's capability (None: not known yet -- the worker decides)."""
    if not parts:
        return
    param = parts[0][0]
    if accepts_images is False:
        raise OpenAIError(400, f"The model '{model}' does not accept image input (it is a text-only model): "
                          f"remove the image part '{param}' or use a vision model.", param=param,
                          code="image_input_not_supported")
    if len(parts) > MAX_IMAGES:
        raise OpenAIError(400, f"Too many images: at most {MAX_IMAGES} per request.", param=parts[MAX_IMAGES][0],
                          code="too_many_images")
    for param, url in parts:
        problem = image_problem(url)
        if problem is not None:
            raise OpenAIError(400, problem, param=param, code="invalid_image_url")
