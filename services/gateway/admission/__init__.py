"""Admission at the edge: per-identity, per-model rate limits (requests and tokens per minute)."""
