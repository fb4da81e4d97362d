"""The architecture families; importing this registers every model."""

from zoo.models.fused_network import FusedAttentionNetwork
from zoo.models.image_transformer import ImageTransformer
from zoo.models.text_transformer import TextTransformer

__all__ = ["FusedAttentionNetwork", "ImageTransformer", "TextTransformer"]
