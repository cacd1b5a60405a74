"""Pieces every service shares: rich gRPC errors, environment defaults."""
