"""What differs per layer type and per model family, as data: the table of layer types
(:mod:`.layer_types`) and the model families' encodings and presets (:mod:`.presets`).
Everything above reads these tables; nothing here imports anything but the errors."""

from staticattn.model.layer_types import (
    LAYER_TYPES,
    Addressing,
    Cache,
    LayerType,
    Reads,
    layer_type,
)
from staticattn.model.presets import (
    ARCHITECTURES,
    PRESETS,
    Architecture,
    ModelPreset,
    architecture,
    model_preset,
)
from staticattn.model.sources import LayerSources, resolve_sources

__all__ = ["ARCHITECTURES", "Addressing", "Architecture", "Cache", "LAYER_TYPES", "LayerSources",
           "LayerType", "ModelPreset", "PRESETS", "Reads", "architecture", "layer_type",
           "model_preset", "resolve_sources"]
