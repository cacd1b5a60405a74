"""Clients of the mship services: the Python gRPC client for internal callers and the `mship` CLI."""
