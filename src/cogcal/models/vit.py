"""A small Vision Transformer for 32x32 inputs (patch 4, 64 tokens + a class token).

Default size: width 256, depth 6, 8 heads, MLP 512 (about 3.2M parameters), the
widely used from-scratch CIFAR configuration; the exact ViT of Jordahn & Olmos
(2024) is not pinned by the paper, see ``docs/models.md``. Pre-norm blocks, learned
position embeddings, the class token's final LayerNorm-ed state is the feature
vector, then the linear head.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from cogcal.models.registry import Backbone, check_batch, image_shape, register_model

__all__ = ["SmallViT", "TransformerBlock"]


class TransformerBlock(nn.Module):
    """Pre-norm encoder block: x + MHSA(LN(x)), then x + MLP(LN(x)) with GELU."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, dropout: float) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"ViT width {dim} must be divisible by the number of heads {heads}.")
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_dim, dim),
        )
        self.dropout = nn.Dropout(dropout)
        self.attn_dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(n, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (N, heads, T, d_head)
        p = self.attn_dropout if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        x = x + self.dropout(self.proj(a.transpose(1, 2).reshape(n, t, d)))
        return x + self.dropout(self.mlp(self.norm2(x)))


class SmallViT(Backbone):
    """Vision Transformer with a class token; ``num_features = dim``.

    Parameters
    ----------
    num_classes : int
        Number of outputs.
    input_shape : tuple of int
        ``(C, H, W)`` with ``H`` and ``W`` divisible by ``patch_size``.
    patch_size : int, default 4
        Side of the square, non-overlapping patches.
    dim : int, default 256
        Token width.
    depth : int, default 6
        Number of encoder blocks.
    heads : int, default 8
        Attention heads per block.
    mlp_dim : int, default 512
        Hidden width of each block's MLP.
    dropout : float, default 0.0
        Dropout on the embeddings, attention weights, and block outputs.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, ...],
        patch_size: int = 4,
        dim: int = 256,
        depth: int = 6,
        heads: int = 8,
        mlp_dim: int = 512,
        dropout: float = 0.0,
    ) -> None:
        c, h, w = image_shape("vit_small", input_shape, min_size=patch_size, multiple_of=patch_size)
        super().__init__(dim, num_classes)
        self.patch_size = patch_size
        num_patches = (h // patch_size) * (w // patch_size)
        self.patch_embed = nn.Conv2d(c, dim, kernel_size=patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, dim))
        self.pos_drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(
            *(TransformerBlock(dim, heads, mlp_dim, dropout) for _ in range(depth))
        )
        self.norm = nn.LayerNorm(dim)
        self._image_shape = (c, h, w)
        self._init()

    def _init(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        # patch embedding as a linear map of the flattened patch
        nn.init.xavier_uniform_(self.patch_embed.weight.view(self.patch_embed.out_channels, -1))
        nn.init.zeros_(self.patch_embed.bias)
        for m in self.blocks.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Patchify, add class token and positions, encode; LayerNorm-ed class token."""
        check_batch("vit_small", x, self._image_shape)
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)  # (N, P, dim)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        tokens = self.pos_drop(torch.cat([cls, tokens], dim=1) + self.pos_embed)
        return self.norm(self.blocks(tokens)[:, 0])


@register_model(
    "vit_small",
    default_input_shape=(3, 32, 32),
    input_check=partial(image_shape, "vit_small", min_size=4, multiple_of=4),
    description="ViT for 32x32, patch 4, width 256, depth 6, 8 heads, MLP 512, class token",
)
def vit_small(num_classes: int, input_shape: tuple[int, ...], **kwargs) -> SmallViT:
    """Build the small ViT (options: patch_size, dim, depth, heads, mlp_dim, dropout)."""
    return SmallViT(num_classes, input_shape, **kwargs)
