"""The torch layer: :class:`RouteDataset` and batch helpers (the only code that imports torch)."""

try:
    import torch as _torch  # noqa: F401 - fail here, with the install hint, when the extra is missing
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("r3store.dataset needs PyTorch: pip install 'r3store[torch]'") from exc

from r3store.dataset._batches import plan_batches, sample_fingerprint
from r3store.dataset._dataset import RouteDataset
from r3store.dataset._packed import unpack_routes
from r3store.dataset._tensors import apply_plan_tensor, batch_to_tensors, to_device
from r3store.dataset._topology import Topology

__all__ = [
    "RouteDataset",
    "Topology",
    "apply_plan_tensor",
    "batch_to_tensors",
    "plan_batches",
    "sample_fingerprint",
    "to_device",
    "unpack_routes",
]
