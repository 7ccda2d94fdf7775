"""Prefill context parallelism on the device: the split of a staged global batch into every
rank's rows (:mod:`.split_rows`), and one rank's fields and input views from them
(:mod:`.rank_inputs`), each in a few Triton launches where the torch build runs hundreds of
small ops."""
