"""`/v1/models` objects: the model card and the list of them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

OWNER = "mship"


def model_card(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": OWNER}


def model_list(names: Iterable[str], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(name, created) for name in sorted(names)]}
