"""Prefill context parallelism on the device: each rank's rows, metadata, gathered layout,
prefill KV extents and V4.1 ring links, built from the staged global batch with fixed
capacities (``prefill-context-parallel.md`` §8); the oracle is :mod:`staticattn.reference`'s
``pcp_layout``, ``pcp_chunk_plan`` and ``pcp_ring``."""
