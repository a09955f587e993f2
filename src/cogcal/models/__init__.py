"""Backbone registry: build classifiers by name, every one with the same head contract.

>>> from cogcal.models import list_models
>>> list_models()
['cnn', 'cnn1d', 'mlp', 'resnet101', 'resnet18', 'resnet50', 'vit_small', 'wrn28_10']

Every backbone is a :class:`Backbone`: ``num_features``, ``forward_features(x)``,
``forward_head(features, pre_logits=False)``, ``get_classifier()`` (the final
``nn.Linear``, stored as ``head``) and ``reset_classifier(num_classes)``. Names are
case-insensitive; :func:`check_compatible` tells whether a backbone takes an input shape.
"""

from __future__ import annotations

from cogcal.models import resnet, small, vit, wrn  # noqa: F401  (register the backbones)
from cogcal.models.registry import *  # noqa: F403  (the package's API is the registry's)
from cogcal.models.registry import __all__ as __all__
