"""The real DeepSeek consumers (DeepGEMM, FlashMLA; optional, CUDA): their caches, the
indexer's top-k and the sparse decode, and the step that chains them."""
