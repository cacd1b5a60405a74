"""`/v1/embeddings`: `protocol` (requests and results), `serving`, `router`."""
