"""`/v1/chat/completions`: `protocol` (requests), `protocol_output` (results), `serving`, `router`."""
