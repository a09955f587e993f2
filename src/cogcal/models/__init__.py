"""Backbone registry: build classifiers by name, every one with the same head contract.

>>> from cogcal.models import list_models
>>> list_models()
['cnn', 'cnn1d', 'mlp', 'resnet101', 'resnet18', 'resnet50', 'vit_small', 'wrn28_10']

Every backbone is a :class:`Backbone`: ``num_features``, ``forward_features(x)``,
``forward_head(features, pre_logits=False)``, ``get_classifier()`` (the final
``nn.Linear``, stored as ``head``) and ``reset_classifier(num_classes)``.
"""

from __future__ import annotations

from cogcal.models import resnet, small, vit, wrn  # noqa: F401  (register the backbones)
from cogcal.models.registry import (
    Backbone,
    ModelInfo,
    create_model,
    list_models,
    model_info,
    register_model,
)

__all__ = [
    "Backbone",
    "ModelInfo",
    "create_model",
    "list_models",
    "model_info",
    "register_model",
]
