"""Prefill context parallelism on the device: the split of a staged global batch into every
rank's rows."""
