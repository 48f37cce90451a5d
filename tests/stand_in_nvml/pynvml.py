"""A stand-in ``pynvml`` module (nvidia-ml-py's import name) over ``fake_nvml.FakeNvml``: one GPU.

Put this directory and ``tests/`` on PYTHONPATH and a drain process imports it as it would the real one:
``scripts/gpu_state_check.py --stand-in`` runs that way on a machine without a GPU
(``tests/test_gpu_state_check.py``).
"""

from __future__ import annotations

from fake_nvml import FakeNvml, NVMLError

_NVML = FakeNvml(count=1)


def nvmlInit() -> None:
    pass


def nvmlShutdown() -> None:
    pass


globals().update({name: getattr(_NVML, name) for name in dir(_NVML) if name.startswith("nvml")})
__all__ = ["NVMLError", "nvmlInit", "nvmlShutdown"]
