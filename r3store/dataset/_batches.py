"""Which samples form which batch, and which batches each data-parallel rank gets."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from r3store._checks import parse_int
from r3store._deprecated import renamed_keyword

__all__ = ["plan_batches", "sample_fingerprint"]


def plan_batches(num_tokens: Sequence[int] | np.ndarray, max_tokens_per_batch: int, *,
                 shuffle: bool, seed: int, epoch: int, dp_size: int | None = None,
                 num_replicas: int | None = None) -> list[np.ndarray]:
    """Greedy token-budget batches over the store's samples, as many per data-parallel rank.

    Parameters
    ----------
    num_tokens : sequence of int, shape (num_samples,)
        Tokens per sample, in store order.
    max_tokens_per_batch : int
        Budget on the sum of ``num_tokens`` in a batch (before CP/TP padding). A sample
        longer than the budget forms a batch of its own; none is split or dropped.
    shuffle, seed, epoch
        With ``shuffle``, samples are permuted by ``numpy.random.default_rng([seed, epoch])``.
    dp_size : int, default 1
        Data-parallel ranks the batches are dealt to (batch ``j`` to rank
        ``j % dp_size``). While the batch count is not a multiple of it, the batch
        with the most tokens among those holding two or more samples is cut in two, so
        every rank gets the same number of batches (synchronous DP would hang otherwise)
        and still every sample exactly once. Splitting stops at one sample per batch: if
        the store holds fewer samples than the next multiple of ``dp_size``, the last
        ranks get one batch fewer (each rank's ``len(dataset)`` says how many).
    num_replicas : int, optional
        Deprecated name of ``dp_size``.

    Returns
    -------
    list of ndarray of int64
        Sample positions of each batch, in global batch order.

    Raises
    ------
    r3store.errors.OptionError
        ``dp_size`` is not an int >= 1.
    """
    size = renamed_keyword("plan_batches", "num_replicas", "dp_size", num_replicas, dp_size)
    dp_size = parse_int("dp_size", 1 if size is None else size, minimum=1)
    n = len(num_tokens)
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    batches: list[np.ndarray] = []
    current: list[int] = []
    used = 0
    for i in order:
        size = int(num_tokens[i])
        if current and used + size > max_tokens_per_batch:
            batches.append(np.array(current, dtype=np.int64))
            current, used = [], 0
        current.append(int(i))
        used += size
    if current:
        batches.append(np.array(current, dtype=np.int64))
    return _even_out(batches, np.asarray(num_tokens), dp_size)


def _even_out(batches: list[np.ndarray], num_tokens: np.ndarray, dp_size: int) -> list[np.ndarray]:
    """Split batches until their count is a multiple of ``dp_size`` (when samples allow)."""
    while len(batches) % dp_size:
        splittable = [j for j, b in enumerate(batches) if len(b) > 1]
        if not splittable:
            break
        j = max(splittable, key=lambda k: (int(num_tokens[batches[k]].sum()), -k))
        batch = batches[j]
        cut = int(np.searchsorted(np.cumsum(num_tokens[batch]), num_tokens[batch].sum() / 2))
        cut = min(max(cut, 1), len(batch) - 1)
        batches[j : j + 1] = [batch[:cut], batch[cut:]]
    return batches


def sample_fingerprint(sample_ids: Sequence[str]) -> str:
    """Hex BLAKE2b-128 of the sample ids joined by NUL: tells two stores of equal size apart."""
    joined = "\0".join(sample_ids).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(joined, digest_size=16).hexdigest()
