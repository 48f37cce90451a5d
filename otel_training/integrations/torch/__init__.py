"""PyTorch auto-instrumentation. Importing this package does not import torch."""

from otel_training.integrations.torch.instrumentor import TorchInstrumentor, suspend_steps

__all__ = ["TorchInstrumentor", "suspend_steps"]
