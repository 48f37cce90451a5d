"""An unmodified PyTorch loop: a DataLoader, a linear model, 5 steps; exits with the status given.

    python torch_tiny_loop.py [EXIT_STATUS]
"""

import sys

import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(20, 4), torch.randn(20, 1))
for x, y in torch.utils.data.DataLoader(data, batch_size=4):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
