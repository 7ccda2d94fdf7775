"""Runs across ranks, one process per GPU started by torchrun: the decode-context-parallel
demo (every step checked against the single-GPU step) and bench (per-rank host and GPU time,
the collectives' share, host jitter across ranks)."""
