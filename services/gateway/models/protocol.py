"""`/v1/models` objects: the model card and the list of them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

OWNER = "mship"


def model_card(name: str, created: int, embedding_dimension: int = 0) -> dict[str, Any]:
    """OpenAI's model object; an embedding model also says how long its vectors are."""
    card: dict[str, Any] = {"id": name, "object": "model", "created": created, "owned_by": OWNER}
    if embedding_dimension:
        card["embedding_dimension"] = embedding_dimension
    return card


def model_list(models: Iterable[tuple[str, int]], created: int) -> dict[str, Any]:
    """The list object of `(name, embedding dimension or 0)` pairs, sorted by name."""
    return {"object": "list", "data": [model_card(name, created, dim) for name, dim in sorted(models)]}
