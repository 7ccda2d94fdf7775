"""Decode context parallelism on the device: which rank owns an entry, a rank's share of the
replicated rows, and the exact top-k merge across ranks."""
