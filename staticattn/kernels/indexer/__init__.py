"""The indexer's device work: its decode tensors, prefill chunk plans and key ranges, the
index-K slots, the paged-MQA-logits schedule and the short-context top-k fill."""
