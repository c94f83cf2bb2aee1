"""The store manifest ``r3store.json`` and the zarr group documents beside it.

Format v2 manifest (``schema/FORMAT.md`` section 3)::

    {"format": "r3store", "version": 2, "spec": {...}, "created_at": ..., "created_by": ...,
     "limits": {"max_sample_rows": 4194304}, "checksum": "crc32c:<8 lowercase hex>"}

``checksum`` is the CRC-32C of the canonical JSON of the document without it
(:func:`r3store._format.canonical_json`). Format v1 manifests have neither ``limits`` nor
``checksum``; readers take the default cap for them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib.resources import files
from typing import Any

import google_crc32c
import jsonschema

from r3store._format._json import canonical_json
from r3store._spec import ModelSpec
from r3store._version import __version__
from r3store.errors import ChecksumError, FormatError, FormatVersionError, SpecError

__all__ = [
    "DEFAULT_MAX_SAMPLE_ROWS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_ROWS",
    "READ_VERSIONS",
    "Manifest",
    "load_schema",
    "make_manifest",
    "manifest_bytes",
    "manifest_checksum",
    "parse_manifest",
    "zarr_group_json",
]

FORMAT_NAME = "r3store"
FORMAT_VERSION = 3
"""The version writers create (3: route arrays may be set-coded, ``r3store.set``)."""
READ_VERSIONS = (1, 2, 3)
"""The versions readers read."""
MAX_ROWS = 1 << 40
"""Readers reject route arrays, samples and row offsets of this many rows or more."""
DEFAULT_MAX_SAMPLE_ROWS = 1 << 22
"""Default cap on the rows of one sample (``limits.max_sample_rows``; also the cap of v1 stores)."""


@cache
def load_schema(name: str) -> dict[str, Any]:
    """Load a JSON Schema shipped with r3store (``manifest``, ``sample_table``, ...)."""
    text = files("r3store._schema").joinpath(f"{name}.schema.json").read_text(encoding="utf-8")
    doc: dict[str, Any] = json.loads(text)
    return doc


@cache
def _validator(name: str) -> Any:
    """A JSON Schema validator built once per schema (checking the schema itself each call costs ms)."""
    schema = load_schema(name)
    return jsonschema.validators.validator_for(schema)(schema)


@dataclass(frozen=True)
class Manifest:
    """What a store's ``r3store.json`` says (checked)."""

    version: int
    """Format version of the store (and of every commit in it)."""
    spec: ModelSpec
    """The ModelSpec every route array follows."""
    max_sample_rows: int
    """Cap on the rows of one sample (``limits.max_sample_rows``; the default for v1 stores)."""


def manifest_checksum(doc: dict[str, Any]) -> str:
    """``"crc32c:<8 hex>"`` of the canonical JSON of ``doc`` without its ``checksum`` key.

    Examples
    --------
    >>> manifest_checksum({"format": "r3store", "version": 2, "checksum": "ignored"})
    'crc32c:6ea4325e'
    """
    body = {k: v for k, v in doc.items() if k != "checksum"}
    return f"crc32c:{google_crc32c.value(canonical_json(body)):08x}"


def make_manifest(spec: ModelSpec, *, max_sample_rows: int = DEFAULT_MAX_SAMPLE_ROWS) -> dict[str, Any]:
    """The manifest document (format v3, checksummed) of a new store."""
    doc: dict[str, Any] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "spec": dict(spec.to_dict()),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "created_by": f"r3store {__version__}",
        "limits": {"max_sample_rows": max_sample_rows},
    }
    doc["checksum"] = manifest_checksum(doc)
    return doc


def manifest_bytes(doc: dict[str, Any]) -> bytes:
    """The bytes r3store writes for a manifest (indented JSON; the checksum does not depend on it)."""
    return (json.dumps(doc, indent=2) + "\n").encode()


def parse_manifest(doc: Any, path: str) -> Manifest:
    """Check a manifest (format, version, checksum, ``manifest.schema.json``) and return it.

    Raises
    ------
    r3store.errors.FormatVersionError
        ``format`` is not ``"r3store"`` or ``version`` is not one of :data:`READ_VERSIONS`.
    r3store.errors.ChecksumError
        A version-2 or later manifest whose ``checksum`` does not match its content.
    r3store.errors.FormatError
        The document does not validate, or its spec is invalid.
    """
    if not isinstance(doc, dict):
        raise FormatError(path, "manifest is not a JSON object")
    version = doc.get("version")
    if doc.get("format") != FORMAT_NAME or isinstance(version, bool) or version not in READ_VERSIONS:
        raise FormatVersionError(
            path,
            f"format {doc.get('format')!r} version {version!r} is not readable by this release "
            f"(reads {FORMAT_NAME!r} versions {', '.join(map(str, READ_VERSIONS))})",
        )
    if version >= 2:
        stored, computed = doc.get("checksum"), manifest_checksum(doc)
        if stored != computed:
            raise ChecksumError(path, (), f"manifest checksum {stored!r} does not match its content ({computed})")
    error = jsonschema.exceptions.best_match(_validator("manifest").iter_errors(doc))
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "(root)"
        raise FormatError(path, f"manifest invalid at {where}: {error.message}")
    try:
        spec = ModelSpec.from_dict(doc["spec"])
    except SpecError as exc:
        raise FormatError(path, f"manifest spec is invalid: {exc}") from exc
    limits = doc.get("limits", {})
    return Manifest(version=version, spec=spec,
                    max_sample_rows=limits.get("max_sample_rows", DEFAULT_MAX_SAMPLE_ROWS))


def zarr_group_json(attributes: dict[str, Any] | None = None) -> dict[str, Any]:
    """A zarr v3 group ``zarr.json`` (so zarr tools can browse a store)."""
    return {"zarr_format": 3, "node_type": "group", "attributes": attributes or {}}
