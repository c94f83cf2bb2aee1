"""The read-through cache (``r3store/storage/_caching.py``): it never writes outside its folder."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

import r3store
from r3store._format import is_immutable_key
from r3store.errors import FormatError, StorageError
from r3store.storage import ByteRange, CachingBackend, open_backend
from r3store.testing import forge
from tests.routes import make_store, set_column


def test_caching_store_never_writes_outside_cache_dir(tmp_path: Path, s3_url: str,
                                                      s3_storage_options: dict[str, Any]) -> None:
    """A hostile S3 store holds objects at literal keys with '..' components (legal in S3)."""
    import s3fs

    make_store(s3_url, n=1, storage_options=s3_storage_options)
    fs = s3fs.S3FileSystem(**s3_storage_options)
    fs.invalidate_cache()
    bucket_path = s3_url.removeprefix("s3://")
    (shard,) = [p for p in fs.ls(f"{bucket_path}/routes") if not p.endswith("zarr.json")]
    name = f"escape-{uuid.uuid4().hex[:8]}"
    evil = f"routes/../../../{name}"
    client = _boto3_client(s3_storage_options)
    bucket, prefix = bucket_path.split("/", 1)
    for sub in ("zarr.json", "c/0/0/0"):
        client.put_object(Bucket=bucket, Key=f"{prefix}/{evil}/{sub}", Body=fs.cat_file(f"{shard}/{sub}"))
    (table_key,) = fs.find(f"{bucket_path}/index")
    forged = forge.reseal_table(fs.cat_file(table_key), lambda t: set_column(t, "array", [evil] * t.num_rows))
    fs.pipe_file(table_key, forged)
    cache = tmp_path / "cache"
    # the reader refuses the forged table at open ...
    with pytest.raises(FormatError, match="column 'array'"):
        r3store.open_store(s3_url, storage_options=s3_storage_options, reader={"cache_dir": cache})
    # ... and the cache refuses the key itself (defense in depth)
    inner = open_backend(s3_url, s3_storage_options)
    assert bytes(inner.get(f"{evil}/zarr.json"))  # the object is there, at that literal key
    cached = CachingBackend(inner, cache, immutable=is_immutable_key)
    for read in (lambda: cached.get(f"{evil}/c/0/0/0"), lambda: cached.get_many([f"{evil}/zarr.json"]),
                 lambda: cached.get_ranges(f"{evil}/c/0/0/0", [ByteRange(0, 4)])):
        with pytest.raises(StorageError, match="invalid key"):
            read()
    outside = [p for p in tmp_path.rglob("*") if cache not in p.parents and p != cache]
    assert outside == []
    assert not any(name in str(p) for p in tmp_path.rglob("*"))


def _boto3_client(options: dict[str, Any]) -> Any:
    import boto3

    kwargs = options["client_kwargs"]
    return boto3.client("s3", endpoint_url=kwargs["endpoint_url"], region_name=kwargs["region_name"],
                        aws_access_key_id=options["key"], aws_secret_access_key=options["secret"])
