"""`/v1/models`: `protocol` (model cards), `serving`, `router`."""
