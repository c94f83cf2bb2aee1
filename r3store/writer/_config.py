"""``WriterConfig``: a writer's settings, one frozen object passed whole (or its dict form, ``WriterConfigDict``)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Literal, TypedDict, cast

from r3store._checks import config_from_dict, merge_config, parse_choice, parse_int, parse_optional_int, strict_fields
from r3store.errors import OptionError

__all__ = ["WRITER_ID", "WriterConfig", "WriterConfigDict"]

WRITER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""Syntax of a writer id (commit names are ``<writer_id>-<5 digits>``; see schema/FORMAT.md)."""
ON_INVALID = ("raise", "quarantine")
CODECS = ("bitpack", "set")


class WriterConfigDict(TypedDict, total=False):
    """Dict form of :class:`WriterConfig` (every key optional; missing keys take defaults)."""

    buffer_bytes: int
    chunk_rows: int
    layers_per_chunk: int | None
    object_bytes: int
    on_invalid: Literal["raise", "quarantine"]
    writer_id: str | None
    max_sample_rows: int | None
    spill_dir: str | os.PathLike[str] | None
    clock: Callable[[], datetime] | None
    codec: Literal["bitpack", "set"]
    direct_write_bytes: int | None


@strict_fields
@dataclass(frozen=True, kw_only=True)
class WriterConfig:
    """Settings of a :class:`r3store.RouteWriter`.

    Parameters
    ----------
    buffer_bytes : int
        Commit once completed samples' routes reach this many bytes (2 bytes per id). Open
        multi-turn samples (``final=False``) count toward it too: when the routes held in
        memory reach it, the largest buffered samples are spilled to a scratch folder
        (``spill_dir``) until half of it is left, and read back one part at a time when
        committed. Peak memory is about ``buffer_bytes`` plus one sample part plus one encoded
        storage object, however many samples are open (the buffer objects are encoded into is
        kept from commit to commit: at most about ``object_bytes``).
    chunk_rows : int
        Rows per inner chunk (the unit of decoding and of rank-local reads). 128 keeps the
        bytes a context-parallel rank fetches within 1.25x of its own rows for samples of 8K
        tokens at CP=8 (zig-zag slices of 512 rows); larger chunks cost fewer frames (less
        per-frame work, smaller object indexes). Stores written with another value still
        read (the geometry is stored per array); see FORMAT.md, "Chunk geometry".
    layers_per_chunk : int or None
        MoE layers per inner chunk (the unit of layer-subset reads). ``None``: the largest
        divisor of the MoE-layer count up to 4, so a pipeline stage reads little beyond its
        own layers while batches copy 4-layer runs at once; from 32 MoE layers on, the count
        up to 4 of the least stored overhead (padded layers against per-frame headers), which
        gives a prime count such as 61 two layers per chunk instead of one (see
        ``r3store.writer._commit.default_layers_per_chunk``).
    object_bytes : int
        Target size in bytes of one storage object (``routes/<commit>/c/<i>/0/0``).
    on_invalid : {'raise', 'quarantine'}
        ``"quarantine"`` keeps a sample that fails the checks, flagged with the reason,
        instead of raising (it is hidden from readers unless asked for).
    writer_id : str or None
        Unique per writer; ``None``: ``<UTC time>-<12 random hex digits>``.
    max_sample_rows : int or None
        Cap on rows per sample, written into the manifest of a store this writer creates
        (``limits.max_sample_rows``; ``None``: 2**22, at most 2**40). Readers refuse longer
        samples before allocating; a writer refuses to append them. Given for an existing
        store, it must equal the store's cap.
    spill_dir : str or None
        Folder in which to create the scratch folder for spilled samples (see
        ``buffer_bytes``); ``None``: the system's temporary folder (``TMPDIR``). The scratch
        folder is removed when the writer closes. A path-like is stored as ``str``.
    clock : Callable[[], datetime] or None
        The writer's time source: returns the current time as an aware UTC ``datetime``
        (``None``: ``datetime.now(UTC)``). It names the bucket of each sample table and fills
        ``committed_at``. A seam for tests and simulations (a skewed clock): whatever it says,
        the writer checks each table's bucket against the store's own timestamp before it
        acknowledges the commit (FORMAT.md section 12.2), so no acknowledged sample is hidden
        from readers that use a checkpoint. Not serialisable (:meth:`to_dict` keeps the callable).
    codec : {'bitpack', 'set'}
        Codec of the route arrays this writer commits. ``"bitpack"``: every id in
        ``ceil(log2 num_experts)`` bits, exactly as given (the order of each row's ids kept).
        ``"set"``: each row of ``top_k`` ids as a set (``r3store.set``), about
        ``log2 C(num_experts, top_k) / top_k`` bits per id, 24-28% smaller for 64 to 384
        experts at top-6/8; readers then return each row's ids in ascending order (replay and
        the audits compare sets, see schema/FORMAT.md 5.2). Needs ``num_experts <= 1024`` and
        ``top_k <= 16``. Either codec's arrays read alike; one store may hold both.
    direct_write_bytes : int or None
        On a local store, storage objects of at least this many bytes (default 1 MiB) are
        written with ``O_DIRECT`` (their whole 4 KiB pages, from the writer's page-aligned
        buffer), then fsynced and renamed like every object; ``None``: every write goes
        through the page cache. The trade-off: ``O_DIRECT`` spares the kernel copying each
        object into fresh page-cache pages and reclaiming pages for it (on a machine whose
        cache is full that costs more CPU than encoding the object: a commit through the page
        cache took 3-4x the CPU of ``np.save`` against 1.1-1.6x, ``benchmarks/README.md``, the
        writer row), but the committed bytes are then not in the page cache, so a read soon
        after the commit (a trainer on the same machine reading the fresh rollouts, a
        ``validate`` right after writing) comes from the disk. Choose ``None`` where readers
        follow writers closely on one machine. Durability is the same either way (the fsync
        gives it). Applied to the :class:`r3store.storage.LocalBackend` the writer writes
        through (one passed as ``url`` included: the writer owns the backend it is given);
        other backends ignore it. Where the file system refuses ``O_DIRECT`` (tmpfs before
        Linux 6.6) objects go through the page cache whatever the value.

    Raises
    ------
    r3store.errors.OptionError
        A field has the wrong type or is out of range; the message names it.
    r3store.errors.UnknownOptionError
        (also a ``TypeError``) a keyword is no field: names the closest fields ("did you mean ...?").

    Examples
    --------
    >>> WriterConfig(buffer_bytes=64 << 20).object_bytes
    33554432
    >>> WriterConfig.from_dict({"on_invalid": "quarantine"}).on_invalid
    'quarantine'
    """

    buffer_bytes: int = 256 << 20
    chunk_rows: int = 128
    layers_per_chunk: int | None = None
    object_bytes: int = 32 << 20
    on_invalid: Literal["raise", "quarantine"] = "raise"
    writer_id: str | None = None
    max_sample_rows: int | None = None
    spill_dir: str | None = None
    clock: Callable[[], datetime] | None = None
    codec: Literal["bitpack", "set"] = "bitpack"
    direct_write_bytes: int | None = 1 << 20

    LOOSE_KEYWORDS: ClassVar[tuple[str, ...]] = (
        "buffer_bytes", "chunk_rows", "layers_per_chunk", "object_bytes", "on_invalid", "writer_id",
        "max_sample_rows", "spill_dir")
    """Fields that ``RouteWriter`` took as loose keywords before (deprecated aliases, removed in
    r3store 0.4.0; new fields are never loose keywords)."""

    def __post_init__(self) -> None:
        for name in ("buffer_bytes", "chunk_rows", "object_bytes"):
            object.__setattr__(self, name, parse_int(name, getattr(self, name), minimum=1))
        object.__setattr__(self, "layers_per_chunk", parse_optional_int("layers_per_chunk", self.layers_per_chunk,
                                                                         minimum=1))
        object.__setattr__(self, "max_sample_rows", parse_optional_int("max_sample_rows", self.max_sample_rows,
                                                                        minimum=1, maximum=1 << 40))
        object.__setattr__(self, "direct_write_bytes", parse_optional_int("direct_write_bytes",
                                                                          self.direct_write_bytes, minimum=1))
        parse_choice("on_invalid", self.on_invalid, ON_INVALID)
        parse_choice("codec", self.codec, CODECS)
        if self.clock is not None and not callable(self.clock):
            raise OptionError("clock", self.clock, "must be a callable returning an aware UTC datetime (or None)")
        if self.spill_dir is not None:
            if not isinstance(self.spill_dir, str | os.PathLike):
                raise OptionError("spill_dir", self.spill_dir, "must be a path (str or os.PathLike) or None")
            object.__setattr__(self, "spill_dir", os.fspath(self.spill_dir))
        wid = self.writer_id
        if wid is not None and (not isinstance(wid, str) or not WRITER_ID.fullmatch(wid)):
            raise OptionError("writer_id", wid, f"must match {WRITER_ID.pattern} (letters, digits, '.', '_', '-'; "
                                                "no '/', no leading '.')")

    def to_dict(self) -> WriterConfigDict:
        """The settings as a JSON-ready dict."""
        return cast(WriterConfigDict, dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: WriterConfigDict | Mapping[str, Any]) -> WriterConfig:
        """Settings from a mapping such as :meth:`to_dict` returns (missing keys: defaults).

        Raises
        ------
        r3store.errors.OptionError
            ``d`` is not a mapping, holds an unknown key, or a value is invalid.
        """
        return config_from_dict(cls, d, name="config", unknown="is not a writer setting")

    @classmethod
    def resolve(cls, config: WriterConfig | WriterConfigDict | Mapping[str, Any] | None = None,
                **fields: Any) -> WriterConfig:
        """One config from ``config`` and per-field keywords (``None``: not given).

        Raises
        ------
        r3store.errors.OptionError
            A field is given both ways with different values, or is invalid.
        """
        return merge_config(cls, config, fields, from_dict=cls.from_dict)
