"""The sparse sliding-window device work: window rows, the rows of the layer that reads every
compressed entry, prefill gathers, combined, FlashInfer, DSpark draft and decoder-replay rows."""
