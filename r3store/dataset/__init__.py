"""The torch layer: :class:`RouteDataset` and batch helpers (the only code that imports torch)."""

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("r3store.dataset needs PyTorch: pip install 'r3store[torch]'") from exc

from r3store.dataset._dataset import RouteDataset, apply_plan_tensor, batch_to_tensors, plan_batches, to_device

__all__ = ["RouteDataset", "apply_plan_tensor", "batch_to_tensors", "plan_batches", "to_device"]

RouteDataset.__module__ = "r3store"
