"""The r3store error tree.

Every error r3store raises derives from :class:`R3StoreError` *and* from the
builtin exception a caller would naturally catch, so ``except KeyError`` around
``store.get(...)`` works as well as ``except r3store.errors.SampleNotFoundError``::

    R3StoreError (Exception)
    ├── SpecError (ValueError)                   a ModelSpec is invalid
    │   └── SpecMismatchError                    two ModelSpecs for one store disagree
    ├── RouteValidationError (ValueError)        bad routes handed to a writer
    │   ├── RouteShapeError                      wrong rank, layer count or top-k
    │   ├── ExpertIdError                        id out of range or repeated in a row
    │   ├── RowCountError                        rows != num_tokens - 1
    │   └── PayloadDecodeError                   an engine payload cannot be decoded
    ├── OptionError (ValueError)                 a setting or argument has a bad value
    │   ├── LayoutOptionError                    a layout option has a bad value
    │   ├── UnknownOptionError (TypeError)       a settings object has no field of this name
    │   │   └── UnknownLayoutOptionError         ... and the object is LayoutOptions
    │   └── RangeError (IndexError)              a row or layer range reaches past a sample
    ├── AlignmentError (ValueError)              routes and tokens do not belong together
    ├── DuplicateSampleError (ValueError)        a sample id is written twice
    ├── ContinuationError (ValueError)           a multi-turn append leaves a gap or overlap
    ├── IncompleteSampleError (RuntimeError)     a writer closed with multi-turn samples still open
    ├── ResumeError (ValueError)                 a dataset state does not fit this dataset
    ├── ReplayError (ValueError)                 routes cannot be replayed in (or captured from) a model
    ├── SampleNotFoundError (KeyError)           no committed sample has this id
    ├── LayerError (IndexError)                  a layer is not a stored MoE layer
    ├── NotAStoreError (FileNotFoundError)       a URL holds no r3store manifest
    ├── FormatError (ValueError)                 stored bytes or documents are malformed
    │   ├── FormatVersionError                   a document has an unknown format version
    │   ├── ChecksumError                        a checksum does not match (or a frame is out of place)
    │   ├── SpecConflictError                    two objects of a store hold different ModelSpecs
    │   ├── StoreIdentityError                   an object carries another store's identity (store_id)
    │   └── SampleTooLargeError                  a sample has more rows than the cap
    ├── CodecError (ValueError)                  a codec cannot encode its input or its config is bad
    │   └── UnknownCodecError                    no codec is registered under an id
    ├── StorageError (OSError)                   the storage backend failed (translated)
    │   ├── ObjectNotFoundError (FileNotFoundError)  a key does not exist in the store
    │   └── ReadOnlyStoreError                   a write was attempted on a read-only store
    └── WriterClosedError (RuntimeError)         a closed writer was used

    R3StoreWarning (UserWarning)
    ├── DiscardedSampleWarning                   open samples were dropped at close
    ├── CheckpointWarning                        a checkpoint was ignored (damaged, partial, foreign)
    ├── ClockSkewWarning                         a clock disagrees with the store's; a sample table was moved
    ├── DamagedTableWarning                      a damaged sample table's commit was skipped (on_damaged_table)
    ├── MetadataTypeWarning                      writers disagree on a metadata field's type: read as strings
    └── R3StoreDeprecationWarning (DeprecationWarning)  a deprecated name (the message names the release removing it)

Errors keep the facts as attributes (``sample_id``, ``field``, ``path``, ...) and
build their message from them.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = [
    "AlignmentError",
    "CheckpointWarning",
    "ChecksumError",
    "ClockSkewWarning",
    "CodecError",
    "ContinuationError",
    "DamagedTableWarning",
    "DiscardedSampleWarning",
    "DuplicateSampleError",
    "ExpertIdError",
    "FormatError",
    "FormatVersionError",
    "IncompleteSampleError",
    "LayerError",
    "LayoutOptionError",
    "MetadataTypeWarning",
    "NotAStoreError",
    "ObjectNotFoundError",
    "OptionError",
    "PayloadDecodeError",
    "R3StoreDeprecationWarning",
    "R3StoreError",
    "R3StoreWarning",
    "RangeError",
    "ReadOnlyStoreError",
    "ReplayError",
    "ResumeError",
    "RouteShapeError",
    "RouteValidationError",
    "RowCountError",
    "SampleNotFoundError",
    "SampleTooLargeError",
    "SpecConflictError",
    "SpecError",
    "SpecMismatchError",
    "StorageError",
    "StoreIdentityError",
    "UnknownCodecError",
    "UnknownLayoutOptionError",
    "UnknownOptionError",
    "WriterClosedError",
]


class R3StoreError(Exception):
    """Root of every error raised by r3store.

    Errors pickle with their attributes (they cross process boundaries, e.g. from
    DataLoader workers), although their constructors take several arguments.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(cls: type[R3StoreError], args: tuple[Any, ...], state: dict[str, Any]) -> R3StoreError:
    err = cls.__new__(cls, *args)
    err.args = args
    err.__dict__.update(state)
    return err


class SpecError(R3StoreError, ValueError):
    """A :class:`r3store.ModelSpec` (or one of its fields) is invalid."""


class SpecMismatchError(SpecError):
    """Two model specs that must agree (writer vs. store, two stores) differ.

    Attributes
    ----------
    url : str
        The store whose spec is ``expected``.
    expected : dict
        The spec ``url`` holds, in its dict form.
    got : dict
        The spec it was compared with.
    fields : tuple of str
        The fields that differ.
    """

    def __init__(self, url: str, expected: Any, got: Any) -> None:
        self.url = url
        self.expected = expected
        self.got = got
        self.fields = tuple(k for k in expected if expected.get(k) != got.get(k))
        diffs = "; ".join(f"{k} {_short(expected.get(k))} there vs {_short(got.get(k))}" for k in self.fields)
        super().__init__(f"{url} holds a different ModelSpec: {diffs}")


class RouteValidationError(R3StoreError, ValueError):
    """Routes handed to a writer are malformed; nothing of the sample was written.

    Attributes
    ----------
    sample_id : str
        The sample the bad input belongs to.
    field : str
        The argument or column at fault (``"routes"``, ``"num_tokens"``, ...).
    fault : str
        What is wrong, in words.
    """

    def __init__(self, sample_id: str, field: str, fault: str) -> None:
        self.sample_id = sample_id
        self.field = field
        self.fault = fault
        super().__init__(f"sample {sample_id!r}: {field}: {fault}")


class RouteShapeError(RouteValidationError):
    """Routes have the wrong rank, layer count, top-k or dtype."""


class ExpertIdError(RouteValidationError):
    """An expert id is out of ``[0, num_experts)`` or repeated within one row."""


class RowCountError(RouteValidationError):
    """The row count disagrees with ``num_tokens - 1`` (or ``len(tokens) - 1``)."""


class PayloadDecodeError(RouteValidationError):
    """An engine payload (SGLang base64, vLLM ``.npy``) cannot be decoded or reshaped."""


class OptionError(R3StoreError, ValueError):
    """A setting or argument (writer, reader, dataset or audit option) has a bad value.

    Bad *input data* (routes, tokens, metadata of a sample) raises
    :class:`RouteValidationError` instead; a bad :class:`r3store.ModelSpec` raises
    :class:`SpecError`.

    Attributes
    ----------
    option : str
        Name of the option or argument at fault (``"buffer_bytes"``, ``"cp_rank"``, ...).
    value : object
        The rejected value.
    fault : str
        What is wrong, in words.
    """

    def __init__(self, option: str, value: Any, fault: str) -> None:
        self.option = option
        self.value = value
        self.fault = fault
        super().__init__(f"{option}={_short_repr(value)}: {fault}")


class LayoutOptionError(OptionError):
    """A layout option (or an argument of a layout function) has a bad value."""


class UnknownOptionError(OptionError, TypeError):
    """A settings object (``LayoutOptions``, ``ReaderOptions``, ``WriterConfig``,
    ``RouteColumns``, ...) was given a name that is none of its fields, as a keyword or as
    a key of its dict form.

    Also a ``TypeError`` (what Python raises for an unexpected keyword argument) and a
    ``ValueError`` (what ``from_dict`` raised for an unknown key), so either handler
    catches it.

    Attributes
    ----------
    owner : str
        The settings class (``"LayoutOptions"``).
    option : str
        The unknown name.
    value : object
        The value given under it.
    suggestions : tuple of str
        The closest field names (``difflib``), best first; may be empty.
    fields : tuple of str
        Every field name of ``owner``, sorted.

    ``unknown`` (the dict form) is the fault said of a key (``"is not a layout option"``);
    without it the message starts as Python's own for a keyword argument.
    """

    def __init__(self, owner: str, option: str, value: Any, suggestions: tuple[str, ...],
                 fields: tuple[str, ...], *, unknown: str | None = None) -> None:
        self.owner = owner
        self.option = option
        self.value = value
        self.suggestions = tuple(suggestions)
        self.fields = tuple(fields)
        if unknown is None:  # keyword construction: Python's own words, then the help
            head = f"{owner}() got an unexpected keyword argument {option!r}"
        else:  # the dict form
            head = f"{owner}.from_dict: {option}={_short_repr(value)}: {unknown}"
        if self.suggestions:
            tail = "did you mean " + " or ".join(map(repr, self.suggestions)) + "?"
        else:
            tail = "its fields: " + ", ".join(self.fields)
        self.fault = f"{head}; {tail}"
        Exception.__init__(self, self.fault)


class UnknownLayoutOptionError(UnknownOptionError, LayoutOptionError):
    """An :class:`UnknownOptionError` of :class:`r3store.LayoutOptions` (so also a
    :class:`LayoutOptionError`, which ``LayoutOptions.from_dict`` raised before)."""


class RangeError(OptionError, IndexError):
    """A row range (``rows=``) or a layer range (``layers=``) reaches past a sample.

    Readers refuse such a range instead of clipping it as numpy slicing does: fewer
    rows than asked for, silently, is the off-by-one R3 exists to stop.

    Attributes
    ----------
    sample_id : str
    option : str
        ``"rows"`` or ``"layers"``.
    value : object
        The range as given.
    bounds : str
        The sample's rows, in words (``"9 rows (0 to 8)"``).
    fault : str
        What is wrong, the sample and its rows, in words (what the command line prints).
    """

    def __init__(self, sample_id: str, option: str, value: Any, bounds: str, fault: str) -> None:
        self.sample_id = sample_id
        self.option = option
        self.value = value
        self.bounds = bounds
        self.fault = f"{fault}; sample {sample_id!r} has {bounds}"
        Exception.__init__(self, f"{option}={_short_repr(value)}: {self.fault}")


class AlignmentError(R3StoreError, ValueError):
    """Routes and the trainer's tokens do not belong together.

    Attributes
    ----------
    sample_id : str or None
        The sample at fault; None when the fault is the batch's (the message is then the fault alone).
    fault : str
    """

    def __init__(self, sample_id: str | None, fault: str) -> None:
        self.sample_id = sample_id
        self.fault = fault
        super().__init__(fault if sample_id is None else f"sample {sample_id!r}: {fault}")


class DuplicateSampleError(R3StoreError, ValueError):
    """A sample id was written more than once.

    Attributes
    ----------
    sample_id : str
    commits : tuple of str
        The commits holding the id (empty when the writer caught it before any commit).
    """

    def __init__(self, sample_id: str, commits: tuple[str, ...] = (), detail: str = "") -> None:
        self.sample_id = sample_id
        self.commits = tuple(commits)
        where = f" (committed in commits {', '.join(map(repr, self.commits))})" if commits else ""
        extra = f"; {detail}" if detail else ""
        super().__init__(f"sample {sample_id!r} is written more than once{where}{extra}")

    @property
    def shards(self) -> tuple[str, ...]:
        """Deprecated name of :attr:`commits` (removed in r3store 0.4.0)."""
        warnings.warn("DuplicateSampleError.shards is deprecated and will be removed in r3store 0.4.0; use "
                      "DuplicateSampleError.commits", R3StoreDeprecationWarning, stacklevel=2)
        return self.commits


class ContinuationError(R3StoreError, ValueError):
    """A multi-turn continuation does not start where the open sample ends.

    Attributes
    ----------
    sample_id : str
    have : tuple of int
        Half-open row range ``[0, n)`` already written.
    got : tuple of int
        Half-open row range ``[start, start + rows)`` of the rejected call.
    """

    def __init__(self, sample_id: str, have: tuple[int, int], got: tuple[int, int]) -> None:
        self.sample_id = sample_id
        self.have = have
        self.got = got
        kind = "a gap" if got[0] > have[1] else "an overlap"
        super().__init__(
            f"sample {sample_id!r}: continuation rows [{got[0]}, {got[1]}) leave {kind} "
            f"after rows [{have[0]}, {have[1]}) already written; start must be {have[1]}"
        )


class IncompleteSampleError(R3StoreError, RuntimeError):
    """A writer was closed while multi-turn samples were still open; none of them is stored.

    Attributes
    ----------
    sample_ids : tuple of str
    """

    def __init__(self, sample_ids: list[str] | tuple[str, ...]) -> None:
        self.sample_ids = tuple(sample_ids)
        super().__init__(
            f"writer closed with open (non-final) samples {list(self.sample_ids)}; "
            "they were not stored (append with final=True to complete a sample)"
        )


class ResumeError(R3StoreError, ValueError):
    """A ``RouteDataset`` state dict was saved under another setting or topology.

    Attributes
    ----------
    key : str
        The state entry that differs.
    saved, current : object
    """

    def __init__(self, key: str, saved: Any, current: Any) -> None:
        self.key = key
        self.saved = saved
        self.current = current
        super().__init__(f"cannot resume: state has {key}={saved!r}, this dataset has {current!r}")


class ReplayError(R3StoreError, ValueError):
    """Routes cannot be replayed in a model's forward, or captured from it.

    Raised for routes whose layer count, top-k or row count do not match the model or
    the batch, ids out of range, a model in which no router is found, or an activation
    recompute that cannot be matched to the routes of its forward.

    Attributes
    ----------
    fault : str
        What is wrong, in words.
    layer : int or None
        The decoder layer at fault, when one is.
    """

    def __init__(self, fault: str, layer: int | None = None) -> None:
        self.fault = fault
        self.layer = layer
        where = f"decoder layer {layer}: " if layer is not None else ""
        super().__init__(f"{where}{fault}")


class SampleNotFoundError(R3StoreError, KeyError):
    """No committed (and non-quarantined) sample has this id.

    Attributes
    ----------
    sample_id : str
    url : str
    quarantined : str or None
        The quarantine reason, when the sample exists but is quarantined.
    hint : str or None
        What to do about it (default, for a quarantined sample: how to read it).
    """

    def __init__(self, sample_id: str, url: str = "", quarantined: str | None = None,
                 hint: str | None = None) -> None:
        self.sample_id = sample_id
        self.url = url
        self.quarantined = quarantined
        self.hint = hint
        super().__init__(sample_id)

    def __str__(self) -> str:
        where = f" in {self.url}" if self.url else ""
        if self.quarantined is not None:
            hint = self.hint or ("get(sample_id, include_quarantined=True) or r3store show reads it; assemble and "
                                 "RouteDataset never return quarantined samples")
            return f"sample {self.sample_id!r}{where} is quarantined ({self.quarantined}); {hint}"
        return f"no committed sample {self.sample_id!r}{where}"


class LayerError(R3StoreError, IndexError):
    """A requested decoder layer is not one of the stored MoE layers.

    Attributes
    ----------
    layer : int
    moe_layers : tuple of int
    fault : str
    sample_id : str or None
        The sample being read, when the layers were asked of one (``get``).
    """

    def __init__(self, layer: int, moe_layers: tuple[int, ...], fault: str = "is not a stored MoE layer", *,
                 sample_id: str | None = None, layers: Any = None) -> None:
        self.layer = layer
        self.moe_layers = tuple(moe_layers)
        self.fault = fault
        self.sample_id = sample_id
        span = _span(self.moe_layers)
        where = "" if sample_id is None else f"sample {sample_id!r}: layers={_short_repr(layers)}: "
        super().__init__(f"{where}decoder layer {layer} {fault} (MoE layers: {span})")


class NotAStoreError(R3StoreError, FileNotFoundError):
    """The URL holds no r3store manifest (``r3store.json``).

    Attributes
    ----------
    url : str
    """

    def __init__(self, url: str, detail: str = "r3store.json not found") -> None:
        self.url = url
        self.detail = detail
        super().__init__(f"{url} is not an r3store store: {detail}")

    @classmethod
    def missing_manifest(cls, backend: Any) -> NotAStoreError:
        """The error for a store whose ``r3store.json`` is absent, naming a missing folder or
        bucket (``backend.missing_root()``) when that is the fault."""
        why = backend.missing_root() if hasattr(backend, "missing_root") else None
        return cls(backend.url, f"{why} (no r3store.json)" if why else "r3store.json not found")


class FormatError(R3StoreError, ValueError):
    """A stored document or byte range is malformed.

    Attributes
    ----------
    path : str
        The object (key or URL) at fault.
    """

    def __init__(self, path: str, fault: str) -> None:
        self.path = path
        self.fault = fault
        super().__init__(f"{path}: {fault}")


class FormatVersionError(FormatError):
    """A document carries a format or version this release cannot read."""


class ChecksumError(FormatError):
    """A stored checksum does not match its bytes, or a frame is bound to another place.

    Raised for route frames and object indexes (CRC-32C, position tags), the manifest
    (CRC-32C) and sample tables (page CRCs, BLAKE2b digest).

    Attributes
    ----------
    array : str
        Path of the route array (relative to the store root), or of the document.
    chunk : tuple of int
        Inner-chunk grid coordinates ``(row_chunk, layer_chunk, 0)``; empty for documents.
    """

    def __init__(self, array: str, chunk: tuple[int, ...], fault: str) -> None:
        self.array = array
        self.chunk = tuple(chunk)
        where = f"chunk {self.chunk}: " if self.chunk else ""
        super().__init__(array, f"{where}{fault}")


class StoreIdentityError(FormatError):
    """An object names another store than the one it lies in: its ``store_id`` (format v3)
    differs from the manifest's, e.g. a checkpoint or sample table copied from a forked store
    or a restored backup whose commits have the same names (FORMAT.md section 12).

    Attributes
    ----------
    expected, found : str or None
        The manifest's ``store_id`` and the object's (None: it carries none).
    """

    def __init__(self, path: str, expected: str | None, found: str | None, what: str = "object") -> None:
        self.expected = expected
        self.found = found
        super().__init__(path, f"{what} of another store: store_id {found!r}, the manifest's is {expected!r} "
                               "(copied from a fork, a backup or another store with the same commit names)")


class SpecConflictError(FormatError):
    """Two objects of one store hold different :class:`r3store.ModelSpec` s (the manifest, a
    sample table's ``r3store.spec``, a route array's ``attributes.r3store.spec``).

    Attributes
    ----------
    path : str
        The object that disagrees with ``reference``.
    reference : str
        The object it was compared with (usually ``r3store.json``).
    fields : tuple of str
        The spec fields that differ.
    """

    def __init__(self, path: str, reference: str, expected: Any, got: Any) -> None:
        self.reference = reference
        self.expected = expected
        self.got = got
        if isinstance(expected, dict) and isinstance(got, dict):
            self.fields = tuple(k for k in sorted(set(expected) | set(got)) if expected.get(k) != got.get(k))
            diffs = "; ".join(f"{k} {_short(got.get(k))} here vs {_short(expected.get(k))} there"
                              for k in self.fields)
        else:
            self.fields = ()
            diffs = f"{_short_repr(got)} here vs {_short_repr(expected)} there"
        super().__init__(path, f"holds another ModelSpec than {reference}: {diffs}")


class SampleTooLargeError(FormatError):
    """A sample table names a sample with more rows than the cap (refused before allocating).

    Attributes
    ----------
    sample_id : str
    rows : int
    cap : int
        The store's ``limits.max_sample_rows``, or the ``max_sample_rows`` given to the reader.
    """

    def __init__(self, path: str, sample_id: str, rows: int, cap: int) -> None:
        self.sample_id = sample_id
        self.rows = rows
        self.cap = cap
        super().__init__(path, f"sample {sample_id!r} has {rows:,} rows, more than the cap of {cap:,} rows per "
                               "sample (the store's limits.max_sample_rows; "
                               "open_store(..., reader={'max_sample_rows': ...}) reads larger samples)")


class CodecError(R3StoreError, ValueError):
    """A codec cannot encode its input, or a codec config is invalid.

    Attributes
    ----------
    codec_id : str
    fault : str
    """

    def __init__(self, codec_id: str, fault: str) -> None:
        self.codec_id = codec_id
        self.fault = fault
        super().__init__(f"codec {codec_id!r}: {fault}")


class UnknownCodecError(CodecError):
    """No codec is registered under the given id.

    Attributes
    ----------
    codec_id : str
    hint : str
        How to make the codec available, when r3store knows.
    """

    def __init__(self, codec_id: str, hint: str = "") -> None:
        self.hint = hint
        fault = "no codec is registered under this id" + (f"; {hint}" if hint else "")
        super().__init__(codec_id, fault)


class StorageError(R3StoreError, OSError):
    """The storage backend (local disk, fsspec, s3fs) failed; the cause is chained.

    Attributes
    ----------
    url : str
        The object the operation was on (never carries credentials).
    """

    def __init__(self, url: str, fault: str) -> None:
        self.url = url
        self.fault = fault
        super().__init__(f"{url}: {fault}")


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """A key does not exist in the store."""


class ReadOnlyStoreError(StorageError):
    """A write was attempted through a store opened read-only."""


class WriterClosedError(R3StoreError, RuntimeError):
    """A :class:`r3store.RouteWriter` was used after ``close()``."""


class R3StoreWarning(UserWarning):
    """Root of r3store's warnings."""


class R3StoreDeprecationWarning(R3StoreWarning, DeprecationWarning):
    """A deprecated r3store name (module attribute, keyword, property) was used.

    Its message names the replacement and the release that removes the alias
    (``"... is deprecated and will be removed in r3store 0.4.0; use ..."``). A
    :class:`DeprecationWarning`, so ``pytest.deprecated_call()`` and ``-W error::DeprecationWarning``
    catch it; filter r3store's own with ``-W error::r3store.errors.R3StoreDeprecationWarning``.
    """


class DiscardedSampleWarning(R3StoreWarning):
    """Open (non-final) multi-turn samples were discarded when a writer closed."""


class CheckpointWarning(R3StoreWarning):
    """A checkpoint (``index/<covered>-<token>.checkpoint``) was ignored because it failed its checks;
    the store was opened from its sample tables (or an older checkpoint) instead.

    Attributes
    ----------
    path : str
        The checkpoint's location.
    fault : str
        What was wrong with it.
    """

    def __init__(self, path: str, fault: str) -> None:
        self.path = path
        self.fault = fault
        super().__init__(f"{path}: checkpoint ignored ({fault}); reading the sample tables instead")


class DamagedTableWarning(R3StoreWarning):
    """A commit's sample table (``index/<bucket>/<commit>.parquet``) fails its checks and was
    skipped: the reader opened with ``on_damaged_table="skip"`` sees none of that commit's
    samples (:attr:`r3store.RouteReader.skipped_commits` lists every commit skipped). The
    other commits are read as usual; nothing is written or deleted. ``r3store validate``
    reports the table as a ``damaged_table`` finding.

    Attributes
    ----------
    path : str
        The sample table's location.
    commit : str
        The commit whose samples are left out.
    fault : str
        What is wrong with the table (e.g. a Parquet page fails its CRC).
    """

    def __init__(self, path: str, commit: str, fault: str) -> None:
        self.path = path
        self.commit = commit
        self.fault = fault
        super().__init__(f"{path}: sample table of commit {commit!r} skipped ({fault}); its samples are left out "
                         "of this reader (on_damaged_table='skip')")


class MetadataTypeWarning(R3StoreWarning):
    """Writers disagree on a user metadata field's type (int in one writer's commits, str in
    another's): the field is read as strings for the whole store, so a filter on it compares
    strings. Each writer keeps one type per field; writers do not see each other's.

    Attributes
    ----------
    fields : dict of str to list of str
        Each clashing field and the Arrow types found for it, e.g. ``{"step": ["int64", "string"]}``.
    """

    def __init__(self, fields: dict[str, list[str]]) -> None:
        self.fields = fields
        what = "; ".join(f"{name!r}: {' vs '.join(types)}" for name, types in sorted(fields.items()))
        super().__init__(f"metadata fields of different types in different commits (writers disagree), read as "
                         f"strings for every sample (a filter on them compares strings): {what}")


class ClockSkewWarning(R3StoreWarning):
    """A writer's (or compaction's) clock is behind or ahead of the store's by more than
    the 15-minute margin of FORMAT.md section 12.2. A writer that finds its sample table in
    a bucket a checkpoint reader may skip writes the same table again in the bucket of the
    store's time (one commit, two byte-identical tables) before it acknowledges the commit.

    Attributes
    ----------
    path : str
        The object whose store timestamp was compared.
    skew_s : float
        The local clock minus the store's, in seconds (negative: the local clock is behind).
    """

    def __init__(self, path: str, skew_s: float, action: str) -> None:
        self.path = path
        self.skew_s = skew_s
        super().__init__(f"{path}: this clock is {abs(skew_s) / 60:.0f} min {'behind' if skew_s < 0 else 'ahead of'} "
                         f"the store's; {action} (fix the clock: NTP)")


def _short(value: Any) -> str:
    """A spec value for a message: layer lists as spans (``3..60``)."""
    if isinstance(value, list | tuple) and value and all(isinstance(v, int) for v in value):
        return _span(tuple(value))
    return repr(value)


def _short_repr(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters (a bad value may be a huge list)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _span(layers: tuple[int, ...]) -> str:
    if layers and list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return ", ".join(map(str, layers))
