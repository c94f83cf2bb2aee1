"""One topology object: this process's data-parallel rank and size, and its DataLoader worker."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import get_worker_info

from r3store._checks import parse_int
from r3store.errors import OptionError

__all__ = ["Topology"]


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Where this process sits: data-parallel rank and size, DataLoader worker and count.

    Built once per use by :meth:`detect`. Context, tensor, sequence and pipeline
    parallelism are layout options (:class:`r3store.layout.LayoutOptions`): they change
    how a batch is laid out, not which batches a process gets.

    Examples
    --------
    >>> Topology.detect(dp_rank=1, dp_size=4)
    Topology(dp_rank=1, dp_size=4, worker=0, num_workers=1)
    """

    dp_rank: int = 0
    """Data-parallel rank, ``0 <= dp_rank < dp_size``."""
    dp_size: int = 1
    """Data-parallel ranks (replicas that get different batches)."""
    worker: int = 0
    """DataLoader worker id in this process, ``0 <= worker < num_workers``."""
    num_workers: int = 1
    """DataLoader workers of this process (1 without worker processes)."""

    def __post_init__(self) -> None:
        parse_int("dp_size", self.dp_size, minimum=1)
        parse_int("dp_rank", self.dp_rank, minimum=0, maximum=self.dp_size - 1)
        parse_int("num_workers", self.num_workers, minimum=1)
        parse_int("worker", self.worker, minimum=0, maximum=self.num_workers - 1)

    @classmethod
    def detect(cls, dp_rank: int | None = None, dp_size: int | None = None) -> Topology:
        """The topology of the calling process.

        Parameters
        ----------
        dp_rank, dp_size : int, optional
            Data-parallel rank and size. Both ``None``: the global rank and world size
            of an initialised ``torch.distributed`` (pass the DP rank and size when
            TP/CP/PP ranks must receive the same batches), else 0 and 1. The worker comes
            from ``torch.utils.data.get_worker_info()``.

        Raises
        ------
        r3store.errors.OptionError
            ``dp_size > 1`` without a ``dp_rank`` (and no initialised
            ``torch.distributed``), or a rank out of ``[0, size)``.
        """
        if dp_rank is None and dp_size is None and torch.distributed.is_available() and \
                torch.distributed.is_initialized():
            dp_rank, dp_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if dp_rank is None and dp_size is not None and dp_size > 1:
            raise OptionError("dp_size", dp_size, "needs an explicit dp_rank (torch.distributed is not initialised)")
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return cls(dp_rank=parse_int("dp_rank", 0 if dp_rank is None else dp_rank),
                   dp_size=parse_int("dp_size", 1 if dp_size is None else dp_size), worker=worker,
                   num_workers=num_workers)
