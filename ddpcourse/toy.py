"""The small model and dataset the labs train: fast on a CPU, deterministic, with or without buffers.

Shared by the labs and notebooks from notebooks/01 on (one place, so a fix reaches every module).
"""
import torch
import torch.nn as nn
from torch.utils.data import TensorDataset


def make_dataset(samples=96, in_features=8, seed=0, dtype=torch.float32):
    """A noisy linear regression problem: x ~ N(0, 1), y = x @ w + 0.1 * noise, the same for every seed."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, in_features, generator=generator, dtype=dtype)
    w = torch.randn(in_features, 1, generator=generator, dtype=dtype)
    y = x @ w + 0.1 * torch.randn(samples, 1, generator=generator, dtype=dtype)
    return TensorDataset(x, y)


class TinyNet(nn.Module):
    """Linear -> (BatchNorm) -> ReLU -> (Dropout) -> Linear. BatchNorm adds buffers, Dropout randomness."""

    def __init__(self, in_features=8, hidden=16, out_features=1, batchnorm=False, dropout=0.0):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.norm = nn.BatchNorm1d(hidden) if batchnorm else nn.Identity()
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.norm(self.fc1(x)))))


def build_model(seed=0, **kwargs):
    """A TinyNet whose initial weights depend only on `seed` (the global RNG is seeded first)."""
    torch.manual_seed(seed)
    return TinyNet(**kwargs)
