"""The HTTP edge: the server, SSE framing, disconnect watching, body limits, and the mapping of
errors to HTTP (OpenAI error bodies; gRPC failures to OpenAI errors)."""
