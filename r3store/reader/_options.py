"""``ReaderOptions``: how a store is opened for reading, one frozen object (passed whole or as its dict).

The same options reach :func:`r3store.open_store`, :meth:`RouteReader.open`,
:class:`RouteReader` and :class:`r3store.RouteDataset` (zarr's ``ArrayConfig`` /
``ArrayConfigParams`` pattern: the object, or :class:`ReaderOptionsDict`, its dict form).
Storage credentials are not options of the reader: ``storage_options`` stays a parameter of
its own (it also reaches writers, and an options object is printed in reprs and logs).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypedDict, cast

import pyarrow.compute as pc

from r3store._checks import (
    MAX_ROWS,
    config_from_dict,
    merge_config,
    parse_bool,
    parse_choice,
    parse_int,
    parse_optional_int,
    same_value,
    strict_fields,
)
from r3store.errors import OptionError
from r3store.reader._catalog import ON_DAMAGED_TABLE, ON_DUPLICATE, parse_commits

__all__ = ["ReaderOptions", "ReaderOptionsDict"]


class ReaderOptionsDict(TypedDict, total=False):
    """Dict form of :class:`ReaderOptions` (every key optional; missing keys take defaults)."""

    on_duplicate: Literal["raise", "first", "report"]
    cache_bytes: int
    cache_dir: str | os.PathLike[str] | None
    max_sample_rows: int | None
    commits: Collection[str] | None
    filter: pc.Expression | None
    use_checkpoint: bool
    output_pool_bytes: int
    on_damaged_table: Literal["raise", "skip"]


@strict_fields
@dataclass(frozen=True, kw_only=True, eq=False)
class ReaderOptions:
    """How a store is opened for reading (:func:`r3store.open_store`, ``reader=``).

    Parameters
    ----------
    on_duplicate : {'raise', 'first', 'report'}
        A sample id committed by two commits: raise (:class:`r3store.errors.DuplicateSampleError`,
        naming the id and both commits), keep the earliest commit, or keep the earliest and list
        every duplicate in :attr:`r3store.RouteReader.duplicates` (for audits).
    cache_bytes : int
        Budget in bytes for decoded chunks kept in memory (sequential reads of small samples
        decode each chunk once); ``>= 0``.
    cache_dir : str or None
        Local read-through cache for remote stores (repeated epochs): each route object and
        sample table is downloaded whole on first use and read from this folder afterwards (see
        :class:`r3store.storage.CachingBackend`); applied when the store is opened by URL. A
        path-like is stored as ``str``.
    max_sample_rows : int or None
        Refuse (at open, before allocating anything) a store naming a sample of more rows
        (:class:`r3store.errors.SampleTooLargeError`). ``None``: the store's own cap
        (``limits.max_sample_rows`` of its manifest; 2**22 rows for format v1 stores). Lower it
        to bound what one ``get`` may allocate, raise it (at most 2**40) to read a store whose
        samples are longer than its manifest says.
    commits : tuple[str, ...] or None
        Read only these commits (names as in :attr:`r3store.RouteReader.commits`; stored
        sorted, without repeats): only their sample tables are read (format v1: by key, without
        listing ``index/``; format v2: one listing of ``index/`` finds their buckets), and
        duplicates are resolved among them. For one task of a distributed job (``r3store.ray``
        runs one per group of commits) or a trainer reading the commits of one RL step.
    filter : pc.Expression or None
        Keep only the samples it selects: a boolean expression over sample-table columns
        (``sample_id``, ``committed_at``, ``policy_version``, user metadata such as ``step``),
        e.g. ``pc.field("step") == 7``. Pushed down: the checkpoint's rows and each newer sample
        table are filtered as they are read, before anything is merged or indexed; duplicates
        are then resolved among the selected rows. The result equals a full open filtered with
        :func:`r3store.reader.filter_samples`.
    use_checkpoint : bool
        Start from the newest valid checkpoint (``index/*.checkpoint``, written by
        :func:`r3store.compact`) and read only the sample tables of commits it does not cover. A
        checkpoint that fails its checks is skipped with a :class:`r3store.errors.CheckpointWarning`.
        False reads every sample table.
    output_pool_bytes : int
        Budget in bytes of output memory kept for reuse (``>= 0``; 0: off). The arrays
        that ``get``, ``get_many`` and ``assemble`` return (from 4 MiB) are views of blocks
        the reader keeps; once nothing refers to an array any more (its CPython reference
        count), its block builds a later output of a fitting size (at most twice the
        size). Fresh memory costs a page fault and the kernel's zeroing of every page on
        first write, about 3 ms per 50 MB here: a training loop that reads batches of
        similar size reads into memory already mapped. The reader holds at most this many
        bytes of blocks, in use or free, after the arrays are dropped (see
        :class:`r3store.reader.BufferPool`).
    on_damaged_table : {'raise', 'skip'}
        A commit's sample table that fails its checks (a Parquet page or digest fails its
        checksum, an unreadable or malformed table: :class:`r3store.errors.ChecksumError` or
        :class:`r3store.errors.FormatError`; not a table of another spec or store, or over
        ``max_sample_rows``). ``'raise'`` (the default): the open (or ``refresh``) fails with
        that error. ``'skip'``: that commit alone is left out, with one
        :class:`r3store.errors.DamagedTableWarning` naming the table, the commit and the fault,
        and listed in :attr:`r3store.RouteReader.skipped_commits`; every other commit is read.
        The default raises because skipping changes what a trainer sees: a damaged table
        hides all of its commit's samples, and a job must not train on fewer samples unless
        someone chose to. Commits a valid checkpoint covers need no table (their rows come
        from the checkpoint), so ``r3store compact`` keeps a damaged table's samples readable
        when it ran before the damage. The audit commands (``validate``, ``inspect``,
        ``stats``) open with ``'skip'`` and report each skipped table.

    Raises
    ------
    r3store.errors.OptionError
        A field has the wrong type or is out of range; the message names it.
    r3store.errors.UnknownOptionError
        (also a ``TypeError``) a keyword is no field: names the closest fields ("did you mean ...?").

    Examples
    --------
    >>> import pyarrow.compute as pc
    >>> ReaderOptions(on_duplicate="first", filter=pc.field("step") == 7).use_checkpoint
    True
    >>> ReaderOptions.from_dict({"commits": ["w-00001", "w-00000"]}).commits
    ('w-00000', 'w-00001')
    """

    on_duplicate: Literal["raise", "first", "report"] = "raise"
    cache_bytes: int = 64 << 20
    cache_dir: str | None = None
    max_sample_rows: int | None = None
    commits: tuple[str, ...] | None = None
    filter: pc.Expression | None = None
    use_checkpoint: bool = True
    output_pool_bytes: int = 512 << 20
    on_damaged_table: Literal["raise", "skip"] = "raise"

    LOOSE_KEYWORDS: ClassVar[tuple[str, ...]] = (
        "on_duplicate", "cache_bytes", "cache_dir", "max_sample_rows", "commits", "filter", "use_checkpoint")
    """Fields that ``open_store``, ``RouteReader`` and ``RouteDataset`` took as loose keywords
    before (deprecated aliases, removed in r3store 0.4.0; new fields are never loose keywords)."""

    def __post_init__(self) -> None:
        parse_choice("on_duplicate", self.on_duplicate, ON_DUPLICATE)
        object.__setattr__(self, "cache_bytes", parse_int("cache_bytes", self.cache_bytes, minimum=0))
        if self.cache_dir is not None:
            if not isinstance(self.cache_dir, str | os.PathLike):
                raise OptionError("cache_dir", self.cache_dir, "must be a path (str or os.PathLike) or None")
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        object.__setattr__(self, "max_sample_rows", parse_optional_int("max_sample_rows", self.max_sample_rows,
                                                                        minimum=1, maximum=MAX_ROWS))
        if self.commits is not None:
            object.__setattr__(self, "commits", tuple(parse_commits(self.commits)))
        if self.filter is not None and not isinstance(self.filter, pc.Expression):
            raise OptionError("filter", self.filter, "must be a pyarrow.compute.Expression, e.g. pc.field('step') == 3")
        object.__setattr__(self, "use_checkpoint", parse_bool("use_checkpoint", self.use_checkpoint))
        object.__setattr__(self, "output_pool_bytes", parse_int("output_pool_bytes", self.output_pool_bytes,
                                                                 minimum=0))
        parse_choice("on_damaged_table", self.on_damaged_table, ON_DAMAGED_TABLE)

    def __eq__(self, other: object) -> bool:
        """Field by field (``filter`` expressions by :meth:`pyarrow.compute.Expression.equals`)."""
        if not isinstance(other, ReaderOptions):
            return NotImplemented
        return all(same_value(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self))

    __hash__ = None  # type: ignore[assignment]  # holds an expression and a tuple of names: compared, not hashed

    def to_dict(self) -> ReaderOptionsDict:
        """The options as a dict (``filter`` stays a pyarrow expression; ``commits`` a tuple)."""
        return cast(ReaderOptionsDict, {f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    @classmethod
    def from_dict(cls, d: ReaderOptionsDict | Mapping[str, Any]) -> ReaderOptions:
        """Options from a mapping such as :meth:`to_dict` returns (missing keys: defaults).

        Raises
        ------
        r3store.errors.OptionError
            ``d`` is not a mapping, holds an unknown key, or a value is invalid.
        """
        return config_from_dict(cls, d, name="reader", unknown="is not a reader option")

    @classmethod
    def resolve(cls, options: ReaderOptions | ReaderOptionsDict | Mapping[str, Any] | None = None,
                **fields: Any) -> ReaderOptions:
        """One :class:`ReaderOptions` from ``options`` and per-field keywords (``None``: not given).

        Raises
        ------
        r3store.errors.OptionError
            ``options`` is neither a ReaderOptions nor a mapping, a field is given both
            ways with different values, or a value is invalid.
        """
        return merge_config(cls, options, fields, from_dict=cls.from_dict, name="reader")
