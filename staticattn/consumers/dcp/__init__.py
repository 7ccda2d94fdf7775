"""Consumers under decode context parallelism: the reference DCP decode, the per-rank shares of
the replicated rows and the exact top-k merge across ranks."""
