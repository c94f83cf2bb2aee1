"""Issue 22 items 5 and 6 on the loopback S3 server: bounded stalls, and a missing bucket named.

* A stalled S3 read gave up only after ~126 s with the defaults: s3fs's retry loop runs twice
  over around botocore's (2 x 2 x 3 attempts of 10 s). The default read timeout is now 5 s,
  so it fails after 12 attempts of 5 s (``S3_STALL_BOUND_S`` = 60 s), while a connection that
  breaks is still retried.
* A bucket that does not exist read as "is not an r3store store: r3store.json not found".
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

import r3store
from r3store.errors import NotAStoreError, StorageError
from r3store.storage import FsspecBackend, open_backend
from r3store.storage._s3 import S3_CONFIG_DEFAULTS, S3_STALL_BOUND_S
from r3store.testing.s3 import S3Counter

SPEC = r3store.ModelSpec(num_layers=1, num_experts=8, top_k=2)
ROUTES = np.array([[[1, 2]], [[3, 4]], [[5, 6]]], dtype=np.int32)

pytestmark = pytest.mark.s3


def test_the_default_stall_bound_is_about_a_minute(s3_url: str, s3_storage_options: dict[str, Any]) -> None:
    backend = open_backend(s3_url, {**s3_storage_options, "skip_instance_cache": True})
    assert isinstance(backend, FsspecBackend)
    config = backend.fs.config_kwargs
    attempts = backend.fs.retries ** 2 * config["retries"]["total_max_attempts"]  # s3fs's loop runs twice over
    assert attempts * config["read_timeout"] == S3_STALL_BOUND_S <= 65
    assert backend.fs.retries >= 2  # the body-read loop still retries a connection that breaks mid-body
    assert config["retries"]["total_max_attempts"] >= 3


def test_a_read_whose_every_response_stalls_makes_twelve_attempts(
        s3_url: str, s3_storage_options: dict[str, Any], s3_counter: S3Counter) -> None:
    """The default retry structure, timed with a 0.5 s read timeout: 12 attempts, so 60 s at the default 5 s."""
    with r3store.RouteWriter(s3_url, SPEC, storage_options=s3_storage_options) as w:
        w.append("a", ROUTES)
    options = {**s3_storage_options, "skip_instance_cache": True, "config_kwargs": {"read_timeout": 0.5}}
    store = r3store.open_store(s3_url, storage_options=options)
    s3_counter.stall_next(40, 30, methods={"GET"})
    start = time.monotonic()
    with pytest.raises(StorageError, match="/routes/"):
        store.get("a")
    took = time.monotonic() - start
    stalled = [r for r in s3_counter.log if r.fault == "stall"]
    s3_counter.reset()
    attempts = S3_STALL_BOUND_S / S3_CONFIG_DEFAULTS["read_timeout"]
    assert len(stalled) == attempts == 12
    assert took < attempts * 0.5 + 10, took  # the read timeouts plus s3fs's short back-off sleeps


def test_a_dropped_connection_is_still_retried(s3_url: str, s3_storage_options: dict[str, Any],
                                               s3_counter: S3Counter) -> None:
    with r3store.RouteWriter(s3_url, SPEC, storage_options=s3_storage_options) as w:
        w.append("a", ROUTES)
    store = r3store.open_store(s3_url, storage_options={**s3_storage_options, "skip_instance_cache": True})
    s3_counter.drop_next(2, methods={"GET"})
    np.testing.assert_array_equal(store.get("a"), ROUTES)


def test_a_bucket_that_does_not_exist_is_named(s3_storage_options: dict[str, Any]) -> None:
    with pytest.raises(NotAStoreError, match=r"bucket 'no-such-bucket-r3' does not exist \(S3 NoSuchBucket\)"):
        r3store.open_store("s3://no-such-bucket-r3/store", storage_options=s3_storage_options)


def test_a_missing_key_in_an_existing_bucket_is_not_a_store(s3_url: str, s3_storage_options: dict[str, Any]) -> None:
    with pytest.raises(NotAStoreError, match=r"r3store\.json not found"):
        r3store.open_store(s3_url + "/nothing-here", storage_options=s3_storage_options)
