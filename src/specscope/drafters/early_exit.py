"""Early-exit self-speculation: the target's first layers, its final norm and its LM head as the
draft (LayerSkip, Draft & Verify, SWIFT; transformers' ``assistant_early_exit``).

:func:`early_exit_view` builds that draft as a model of its own that shares every weight with the
target (no memory beyond its KV cache) and keeps a cache of ``exit_layer`` layers, so the
speculation core drafts with it exactly as with a separate draft model. transformers'
``assistant_early_exit`` computes the same distribution (the hidden state after layer
``exit_layer``, normed, through the LM head) but shares the target's cache for those layers; the
tokens proposed are the same, only the cost differs. This module does not train exits: the
target's own layers and head are used as they are.
"""

from __future__ import annotations

import copy

import torch

from .config import DrafterError


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers of a transformers causal LM (``model.model.layers``)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise DrafterError(
            f"early exit needs a decoder-only model with model.layers; {type(model).__name__} "
            "has none"
        )
    return layers


def early_exit_view(target: torch.nn.Module, exit_layer: int) -> torch.nn.Module:
    """A causal LM that runs ``target``'s first ``exit_layer`` decoder layers, then its final norm
    and LM head; every module is the target's own (shared, not copied)."""
    layers = decoder_layers(target)
    if not 1 <= exit_layer < len(layers):
        raise DrafterError(
            f"exit_layer must be in 1..{len(layers) - 1} (the target has {len(layers)} layers), "
            f"got {exit_layer}"
        )
    config = copy.copy(target.config)
    config.num_hidden_layers = exit_layer
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types[:exit_layer])
    inner = copy.copy(target.model)
    inner._modules = dict(inner._modules)  # a new module table; the modules in it are shared
    inner.layers = torch.nn.ModuleList(list(layers)[:exit_layer])
    inner.config = config
    view = copy.copy(target)
    view._modules = dict(view._modules)
    view.model = inner
    view.config = config
    return view
