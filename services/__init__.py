"""mship services: coordinator, gateway, worker, state (each a gRPC service; Ray Serve deployments)."""
