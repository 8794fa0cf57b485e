"""Model code shared by the workloads, built lazily so that `--help` and bad-argument errors need no
torch import.

convnet(in_shape, num_classes, dropout)  the seeds' ConvNet (32x32 inputs) or its 8x8 sibling (digits)
cast_input(module, dtype)                 a wrapper feeding `module` inputs of `dtype` and returning float32
                                          logits (evaluating a DeepSpeed bf16/fp16 engine with
                                          metrics.evaluate)
"""  # noqa: E501

from __future__ import annotations


def convnet(in_shape, num_classes: int, dropout: float):
    """The seeds' network for 3x32x32 inputs, the same shape of network for 8x8 inputs; ValueError
    otherwise."""
    import torch.nn as nn
    import torch.nn.functional as F

    class ConvNet(nn.Module):
        """The seeds' network: conv 3->32->64 (3x3, no padding), fc 64*6*6->128->10 on 32x32x3."""

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(in_shape[0], 32, 3, 1)
            self.conv2 = nn.Conv2d(32, 64, 3, 1)
            self.dropout = nn.Dropout(dropout)
            self.fc1 = nn.Linear(64 * 6 * 6, 128)
            self.fc2 = nn.Linear(128, num_classes)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = self.dropout(x.flatten(1))
            return self.fc2(self.dropout(F.relu(self.fc1(x))))

    class SmallConvNet(nn.Module):
        """The same shape of network for 8x8 inputs: conv 1->16->32 (padding 1), fc
        32*4*4->64->10."""

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(in_shape[0], 16, 3, 1, padding=1)
            self.conv2 = nn.Conv2d(16, 32, 3, 1, padding=1)
            self.dropout = nn.Dropout(dropout)
            self.fc1 = nn.Linear(32 * 4 * 4, 64)
            self.fc2 = nn.Linear(64, num_classes)

        def forward(self, x):
            x = F.relu(self.conv1(x))
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = self.dropout(x.flatten(1))
            return self.fc2(self.dropout(F.relu(self.fc1(x))))

    if tuple(in_shape[1:]) == (32, 32):
        return ConvNet()
    if tuple(in_shape[1:]) == (8, 8):
        return SmallConvNet()
    raise ValueError(f"no ConvNet for input shape {in_shape}")


def cast_input(module, dtype):
    """`module` behind a wrapper that casts its input to `dtype` and its output back to float32."""
    import torch.nn as nn

    class CastInput(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, x):
            return self.inner(x.to(dtype)).float()

    return CastInput()
