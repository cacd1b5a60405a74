"""`/v1/completions`: `protocol` (requests and results), `serving`, `router`."""
