"""Small torch modules the torch-engine tests build their sources from (no downloads)."""

from __future__ import annotations


def small_net(seed: int = 0):
    """conv 3x3 (3->8) + batch norm (randomised statistics) + ReLU + avg pool + linear 8->5,
    on 3x16x16 NCHW float32."""
    import torch

    torch.manual_seed(seed)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 5),
    )
    bn = m[1]
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 2.0)
    return m.eval()


def two_heads():
    """A module with two outputs (a dict): logits [N, 5] and features [N, 8]."""
    import torch

    class TwoHeads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = small_net()

        def forward(self, x):
            f = self.body[:5](x)
            return {"scores": self.body[5](f), "features": f}

    return TwoHeads().eval()


def not_a_module():
    return 42
