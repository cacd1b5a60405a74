"""Image parts' URLs: what may reach a vision model. One check, applied at the edge (a 400 before any
engine work) and again by the worker (a worker reached directly, by the Python client, is bounded too).

Base64 `data:image/...` URLs only (nothing fetches an http(s) image: no egress policy covers it), of
bounded size: decoded bytes and pixels (read from the header, never decoding the picture).
"""

from __future__ import annotations

import base64
import binascii
import io

MAX_IMAGE_BYTES = 16 * 2**20  # decoded, per image
MAX_IMAGE_PIXELS = 4096 * 4096  # per image


def image_problem(url: str) -> str | None:
    """Why an image URL cannot go to a vision model (None: it can), in words for the caller."""
    head, comma, data = url.partition(",")
    scheme = head.split(":", 1)[0].lower() if ":" in head else ""
    if scheme in ("http", "https"):
        return ("Image URLs are not fetched by this server; send the image inline as a base64 data: URL "
                "(data:image/png;base64,...).")
    if scheme != "data":
        return "Invalid image URL: expected a base64 data: URL (data:image/png;base64,...)."
    if not comma or not head.lower().endswith(";base64") or not head[5:].lower().startswith("image/"):
        return "Invalid image URL: expected a base64 data: URL of an image (data:image/<type>;base64,...)."
    if len(data) // 4 * 3 > MAX_IMAGE_BYTES + 3:
        return f"The image is too large: at most {MAX_IMAGE_BYTES} bytes."
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return "Invalid image URL: its data is not valid base64."
    try:
        from PIL import Image
    except ImportError:  # a gateway installed without Pillow: the worker (which has it) checks the picture
        return None
    try:
        width, height = Image.open(io.BytesIO(raw)).size  # reads the header only
    except (OSError, ValueError):
        return "The image data is not a readable image (PNG, JPEG, GIF, WebP, ...)."
    except Exception:  # PIL's DecompressionBombError: far past the bound below
        return f"The image is too large: at most {MAX_IMAGE_PIXELS} pixels."
    if width * height > MAX_IMAGE_PIXELS:
        return f"The image is too large: {width}x{height} pixels, at most {MAX_IMAGE_PIXELS}."
    return None
