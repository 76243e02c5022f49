"""Tiny vision transformers in plain torch (no torchvision, no downloads) for the importer's
tests, written the way torchvision and timm write theirs:

- ``tiny_vit``: patch conv, class token expanded to the batch, position embedding, one
  block with ``nn.MultiheadAttention`` (torchvision's ViT: the batch moves to axis 1
  inside) and one with hand-written attention (timm's: q @ k^T, softmax, @ v);
  ``distilled=True`` adds DeiT's distillation token and averages its head with the class
  head's.
- ``tiny_dinov2``: DINOv2's interpolated position embedding, register tokens, layer scale.
- ``tiny_swin``: torchvision's shifted-window attention at a tiny size: Pad to whole
  windows, roll (Slice + Concat), the shifted windows' mask, the relative position bias,
  patch merging (strided slices).
- ``tiny_convnext``: depthwise 7x7, channels-last LayerNorm and MLP, layer scale,
  LayerNorm2d, downsampling.

Every module takes [N, 3, 16, 16] (Swin [N, 3, 14, 14], DINOv2 [N, 3, 24, 24]) float32 and answers [N, classes].
Its import needs torch (tests import it after ``pytest.importorskip("torch")``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

CLASSES = 10


class _Mlp(nn.Sequential):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


class _Attention(nn.Module):
    """timm's attention: one qkv Linear, heads split by reshape + permute."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, seq, c = x.shape
        qkv = self.qkv(x).reshape(n, seq, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q @ k.transpose(-2, -1)) * self.scale
        x = (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(n, seq, c)
        return self.proj(x)


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, torch_mha: bool) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.torch_mha = torch_mha
        self.attn = (
            nn.MultiheadAttention(dim, heads, batch_first=True)
            if torch_mha
            else _Attention(dim, heads)
        )
        self.mlp = _Mlp(dim, 2 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        y = self.attn(y, y, y, need_weights=False)[0] if self.torch_mha else self.attn(y)
        x = x + y
        return x + self.mlp(self.ln_2(x))


class TinyViT(nn.Module):
    def __init__(self, distilled: bool = False, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.distilled = distilled
        self.patch = nn.Conv2d(3, dim, 4, 4)
        tokens = 16 + (2 if distilled else 1)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.dist_token = nn.Parameter(torch.randn(1, 1, dim) * 0.5) if distilled else None
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.1)
        self.blocks = nn.Sequential(_Block(dim, heads, True), _Block(dim, heads, False))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, CLASSES)
        self.head_dist = nn.Linear(dim, CLASSES) if distilled else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x)
        n, c = x.shape[0], x.shape[1]
        x = x.reshape(n, c, -1).permute(0, 2, 1)
        extra = [self.cls_token.expand(n, -1, -1)]
        if self.dist_token is not None:
            extra.append(self.dist_token.expand(n, -1, -1))
        x = self.norm(self.blocks(torch.cat([*extra, x], dim=1) + self.pos))
        if self.head_dist is None:
            return self.head(x[:, 0])
        return (self.head(x[:, 0]) + self.head_dist(x[:, 1])) / 2


def tiny_vit(distilled: bool = False, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return TinyViT(distilled).eval()


class TinyDinoV2(nn.Module):
    """DINOv2's shape: a position embedding learnt for a 4x4 grid, interpolated (bicubic)
    to the input's 6x6, register tokens after the class token, layer scale, and a head on
    the class token and the patch tokens' mean."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, 4)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.registers = nn.Parameter(torch.randn(1, 2, dim) * 0.5)
        self.pos = nn.Parameter(torch.randn(1, 1 + 16, dim) * 0.1)
        self.blocks = nn.Sequential(_Block(dim, heads, False), _Block(dim, heads, False))
        self.scale = nn.Parameter(torch.rand(dim) + 0.5)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(2 * dim, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        x = self.patch(x).flatten(2).transpose(1, 2)
        grid = self.pos[:, 1:].reshape(1, 4, 4, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(h // 4, w // 4), mode="bicubic", align_corners=False)
        pos = torch.cat([self.pos[:, :1], grid.permute(0, 2, 3, 1).flatten(1, 2)], 1)
        x = torch.cat([self.cls_token.expand(n, -1, -1), x], 1) + pos
        x = torch.cat([x[:, :1], self.registers.expand(n, -1, -1), x[:, 1:]], 1)
        x = self.norm(self.blocks(x) * self.scale)
        return self.head(torch.cat([x[:, 0], x[:, 3:].mean(1)], -1))


def tiny_dinov2(seed: int = 0) -> nn.Module:
    """On [N, 3, 24, 24]."""
    torch.manual_seed(seed)
    return TinyDinoV2().eval()


# ---------------------------------------------------------------------- Swin
def _window_attention(x, qkv, proj, bias, heads, window, shift):
    """torchvision's ``shifted_window_attention`` for [N, H, W, C], at a tiny size."""
    n, h, w, c = x.shape
    pad_r, pad_b = (window - w % window) % window, (window - h % window) % window
    x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
    _, ph, pw, _ = x.shape
    if shift:
        x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
    nw = (ph // window) * (pw // window)
    x = x.view(n, ph // window, window, pw // window, window, c).permute(0, 1, 3, 2, 4, 5)
    x = x.reshape(n * nw, window * window, c)
    q, k, v = qkv(x).reshape(x.size(0), x.size(1), 3, heads, c // heads).permute(2, 0, 3, 1, 4)
    attn = (q * (c // heads) ** -0.5).matmul(k.transpose(-2, -1)) + bias
    if shift:
        mask = x.new_zeros((ph, pw))
        spans = ((0, -window), (-window, -shift), (-shift, None))
        count = 0
        for hs in spans:
            for ws in spans:
                mask[hs[0] : hs[1], ws[0] : ws[1]] = count
                count += 1
        mask = mask.view(ph // window, window, pw // window, window).permute(0, 2, 1, 3)
        mask = mask.reshape(nw, window * window)
        mask = mask.unsqueeze(1) - mask.unsqueeze(2)
        mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
        attn = attn.view(x.size(0) // nw, nw, heads, x.size(1), x.size(1))
        attn = (attn + mask.unsqueeze(1).unsqueeze(0)).view(-1, heads, x.size(1), x.size(1))
    x = (F.softmax(attn, dim=-1) @ v).transpose(1, 2).reshape(x.size(0), x.size(1), c)
    x = proj(x).view(n, ph // window, pw // window, window, window, c)
    x = x.permute(0, 1, 3, 2, 4, 5).reshape(n, ph, pw, c)
    if shift:
        x = torch.roll(x, shifts=(shift, shift), dims=(1, 2))
    return x[:, :h, :w, :].contiguous()


class _SwinBlock(nn.Module):
    def __init__(self, dim: int, heads: int, window: int, shift: int) -> None:
        super().__init__()
        self.heads, self.window, self.shift = heads, window, shift
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.2)
        coords = torch.stack(
            torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
        )
        rel = (coords.flatten(1)[:, :, None] - coords.flatten(1)[:, None, :]).permute(1, 2, 0)
        rel = rel + (window - 1)
        self.register_buffer("index", (rel[:, :, 0] * (2 * window - 1) + rel[:, :, 1]).flatten())
        self.mlp = _Mlp(dim, 2 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ww = self.window * self.window
        bias = self.table[self.index].view(ww, ww, -1).permute(2, 0, 1).unsqueeze(0)
        y = _window_attention(
            self.norm1(x), self.qkv, self.proj, bias, self.heads, self.window, self.shift
        )
        x = x + y
        return x + self.mlp(self.norm2(x))


class _PatchMerging(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm, self.reduction = nn.LayerNorm(4 * dim), nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, (0, 0, 0, x.shape[2] % 2, 0, x.shape[1] % 2))
        parts = [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]]
        return self.reduction(self.norm(torch.cat(parts, -1)))


class TinySwin(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2, window: int = 4) -> None:
        super().__init__()
        self.patch, self.patch_norm = nn.Conv2d(3, dim, 2, 2), nn.LayerNorm(dim)
        self.stage1 = nn.Sequential(
            _SwinBlock(dim, heads, window, 0), _SwinBlock(dim, heads, window, window // 2)
        )
        self.merge = _PatchMerging(dim)
        self.stage2 = _SwinBlock(2 * dim, heads, 2, 0)
        self.norm, self.head = nn.LayerNorm(2 * dim), nn.Linear(2 * dim, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_norm(self.patch(x).permute(0, 2, 3, 1))
        x = self.norm(self.stage2(self.merge(self.stage1(x))))
        x = F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1).flatten(1)
        return self.head(x)


def tiny_swin(seed: int = 0) -> nn.Module:
    """On [N, 3, 14, 14]: 7x7 tokens, padded to 8x8 for 4x4 windows."""
    torch.manual_seed(seed)
    return TinySwin().eval()


# ---------------------------------------------------------------------- ConvNeXt
class _LayerNorm2d(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _CNBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = _Mlp(dim, 4 * dim)
        self.gamma = nn.Parameter(torch.rand(dim, 1, 1) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.mlp(self.norm(self.dw(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return x + self.gamma * y


class TinyConvNeXt(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dim, 4, 4), _LayerNorm2d(dim, eps=1e-6))
        self.stage1 = _CNBlock(dim)
        self.down = nn.Sequential(_LayerNorm2d(dim, eps=1e-6), nn.Conv2d(dim, 2 * dim, 2, 2))
        self.stage2 = _CNBlock(2 * dim)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), _LayerNorm2d(2 * dim, eps=1e-6), nn.Flatten(1),
            nn.Linear(2 * dim, CLASSES),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stage2(self.down(self.stage1(self.stem(x)))))


def tiny_convnext(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return TinyConvNeXt().eval()


MODELS = {  # name: (builder, input shape of one item)
    "vit": (lambda: tiny_vit(False), (3, 16, 16)),
    "deit": (lambda: tiny_vit(True), (3, 16, 16)),
    "dinov2": (tiny_dinov2, (3, 24, 24)),
    "swin": (tiny_swin, (3, 14, 14)),
    "convnext": (tiny_convnext, (3, 16, 16)),
}
