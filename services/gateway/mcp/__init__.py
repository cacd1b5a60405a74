"""Remote MCP servers for `/v1/responses`: tool specs, the egress policy, and a streamable HTTP client."""
