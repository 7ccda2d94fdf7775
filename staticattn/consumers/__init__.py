"""Steps that read the metadata inside the graph: the built-in gather consumer (anywhere) and
the real DeepSeek kernels, DeepGEMM and FlashMLA (optional, CUDA)."""

from staticattn.consumers.emulated.gather import GatherConsumer

__all__ = ["GatherConsumer"]
