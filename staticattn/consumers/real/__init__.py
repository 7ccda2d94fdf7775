"""The real DeepSeek consumers (DeepGEMM, FlashMLA; optional, CUDA): their caches, the
indexer's top-k, the per-type parts built from the table's rows, the sparse decode step
that runs them, and the factory that picks what a machine can run."""
