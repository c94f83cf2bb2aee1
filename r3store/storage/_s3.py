"""S3 ``storage_options``: checked when a store is opened, with r3store's timeout and retry defaults.

s3fs hands option names it does not know to aiobotocore's session and botocore's client and
config, which fail only at the first request (``TypeError``, ``AttributeError``) or not at
all (``anon="yes"``). :func:`s3_options` checks every name and the type of each well-known
value up front and raises :class:`r3store.errors.StorageError` naming the option.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import math
import urllib.parse
from collections.abc import Mapping
from typing import Any

from r3store._checks import is_int
from r3store.errors import StorageError

__all__ = ["S3FS_RETRIES_DEFAULT", "S3_CONFIG_DEFAULTS", "S3_STALL_BOUND_S", "s3_options"]

S3_CONFIG_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 5,
    "read_timeout": 5,
    "retries": {"total_max_attempts": 3, "mode": "standard"},
}
"""botocore ``Config`` defaults r3store sets for S3 (``config_kwargs``; each key given by the
user wins, and each key of a ``retries`` mapping): 5 s to connect, 5 s without a byte of a
response (a stalled response), 3 attempts per request in all (``total_max_attempts``) in
botocore's standard retry mode (5xx, throttling, dropped connections, timeouts)."""

S3FS_RETRIES_DEFAULT = 2
"""Attempts of s3fs's own retry loop around botocore's (``storage_options["retries"]``; s3fs's
default is 5). s3fs runs that loop twice over (around the request, and around the read of its
body, which botocore does not retry: a connection that breaks mid-body is retried here), so a
read whose every response stalls makes ``2 x 2 x 3 = 12`` attempts of ``read_timeout``."""

S3_STALL_BOUND_S = S3FS_RETRIES_DEFAULT ** 2 * S3_CONFIG_DEFAULTS["retries"]["total_max_attempts"] * \
    S3_CONFIG_DEFAULTS["read_timeout"]
"""Seconds after which a read whose every response stalls fails with the defaults, s3fs's short
back-off sleeps aside: ``2 x 2 x 3`` attempts of 5 s = 60 s (it was 120 s with a 10 s read
timeout, and unbounded before). Tighten it with ``config_kwargs={"read_timeout": ...}`` or
``retries``; a larger ``read_timeout`` suits links slower than 5 s to the first byte."""

_BOOL = ("anon", "use_ssl", "requester_pays", "version_aware", "cache_regions", "asynchronous",
         "default_fill_cache", "fixed_upload_size", "skip_instance_cache", "use_listings_cache")
_STR = ("endpoint_url", "key", "secret", "token", "username", "password", "profile", "default_cache_type")
_INT = ("default_block_size", "max_concurrency", "max_paths", "batch_size")
_CLIENT_STR = ("region_name", "api_version", "endpoint_url", "aws_access_key_id", "aws_secret_access_key",
               "aws_session_token", "aws_account_id")


def _params(func: Any) -> set[str]:
    return {name for name, p in inspect.signature(func).parameters.items()
            if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def _known_options() -> set[str]:
    """Every top-level option s3fs and what it passes them to take (checked against the installed versions)."""
    import s3fs
    from aiobotocore.session import AioSession
    from fsspec.dircache import DirCache

    return (_params(s3fs.S3FileSystem.__init__) | _params(AioSession.__init__) | _params(DirCache.__init__)
            | {"skip_instance_cache", "batch_size", "retries"})


def _unknown(url: str, where: str, name: str, known: set[str]) -> StorageError:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(known))})"
    return StorageError(url, f"unknown storage option '{where}{name}'{hint}")


def _check_type(url: str, where: str, name: str, value: Any, kinds: tuple[type, ...], words: str) -> None:
    if value is None or (isinstance(value, kinds) and not (bool not in kinds and isinstance(value, bool))):
        return
    raise StorageError(url, f"storage option '{where}{name}' must be {words}, got {type(value).__name__} {value!r:.60}")


def s3_options(url: str, options: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """Check s3fs ``storage_options`` and add r3store's defaults.

    Parameters
    ----------
    url : str
        The store's URL, credentials masked (for messages).
    options : mapping
        The user's options (names already checked to be ``str``, ``*_kwargs`` mappings).

    Returns
    -------
    options : dict
        For ``s3fs.S3FileSystem``: ``config_kwargs`` merged over :data:`S3_CONFIG_DEFAULTS`,
        ``retries`` removed.
    retries : int
        Attempts of s3fs's own retry loop (``options["retries"]``, default
        :data:`S3FS_RETRIES_DEFAULT`).

    Raises
    ------
    r3store.errors.StorageError
        An option s3fs does not take (with the closest known name), a value of the wrong
        type for a well-known option (``anon="yes"``, ``key=123``), a ``client_kwargs`` key
        botocore's ``create_client`` does not take, an ``endpoint_url`` that is not an
        http(s) URL with a host, a timeout that is not a finite number of seconds > 0, or
        ``config_kwargs`` that botocore's ``Config`` refuses; the message names the option.
    """
    import botocore.config
    import botocore.exceptions
    import botocore.session

    known = _known_options()
    out = dict(options)
    for name, value in out.items():
        if name not in known:
            raise _unknown(url, "", name, known)
        if name in _BOOL:
            _check_type(url, "", name, value, (bool,), "true or false")
        elif name in _STR:
            _check_type(url, "", name, value, (str,), "a string")
        elif name in _INT:
            if value is not None and not is_int(value):
                raise StorageError(url, f"storage option '{name}' must be an integer, got {type(value).__name__} "
                                        f"{value!r:.60}")
            out[name] = None if value is None else int(value)
    retries = out.pop("retries", S3FS_RETRIES_DEFAULT)
    if not is_int(retries) or not 1 <= retries <= 100:
        raise StorageError(url, f"storage option 'retries' (attempts of s3fs's retry loop) must be an integer "
                                f"in [1, 100], got {retries!r:.60}")
    client = dict(out.get("client_kwargs") or {})
    client_known = _params(botocore.session.Session.create_client) - {"service_name"}
    for name, value in client.items():
        if name not in client_known:
            raise _unknown(url, "client_kwargs.", str(name), client_known)
        if name in _CLIENT_STR:
            _check_type(url, "client_kwargs.", name, value, (str,), "a string")
        elif name == "use_ssl":
            _check_type(url, "client_kwargs.", name, value, (bool,), "true or false")
        elif name == "verify":
            _check_type(url, "client_kwargs.", name, value, (bool, str), "true, false or a CA bundle path")
    for where, mapping in (("", out), ("client_kwargs.", client)):
        endpoint = mapping.get("endpoint_url")
        if isinstance(endpoint, str):
            parts = urllib.parse.urlsplit(endpoint)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise StorageError(url, f"storage option '{where}endpoint_url' must be an http:// or https:// URL "
                                        f"with a host (e.g. http://127.0.0.1:9000), got {endpoint!r:.60}")
    given = dict(out.get("config_kwargs") or {})
    config = copy.deepcopy({**S3_CONFIG_DEFAULTS, **given})  # botocore's Config rewrites retries in place
    if isinstance(given.get("retries"), Mapping):  # {"total_max_attempts": 5} keeps the standard mode
        policy = {**S3_CONFIG_DEFAULTS["retries"], **given["retries"]}
        if "max_attempts" in policy and "total_max_attempts" not in given["retries"]:
            del policy["total_max_attempts"]  # botocore's other spelling (retries after the first) given
        config["retries"] = policy
    config_known = set(botocore.config.Config.OPTION_DEFAULTS)
    for name in config:
        if name not in config_known:
            raise _unknown(url, "config_kwargs.", str(name), config_known)
    for name in ("connect_timeout", "read_timeout"):
        _check_type(url, "config_kwargs.", name, config[name], (int, float), "a number of seconds")
        if config[name] is not None and not 0 < config[name] < math.inf:
            raise StorageError(url, f"storage option 'config_kwargs.{name}' must be a finite number of seconds > 0, "
                                    f"got {config[name]!r}")
    try:
        botocore.config.Config(**copy.deepcopy(config))
    except (TypeError, ValueError, AttributeError, botocore.exceptions.BotoCoreError) as exc:
        raise StorageError(url, f"storage option 'config_kwargs' is refused by botocore: {exc}") from exc
    out["config_kwargs"] = config
    return out, retries
