"""The write path: :class:`RouteWriter` (used inside rollout workers) and engine payload decoding.

* the sample buffer (``_buffer.py``): checks, quarantine, multi-turn continuations;
* the commit protocol and storage-object sizing (``_commit.py``);
* :class:`WriterConfig`: the writer's settings, one object;
* :func:`decode_sglang`, :func:`decode_vllm`, :func:`encode_sglang`: engine payloads.
"""

from r3store.writer._config import WriterConfig, WriterConfigDict
from r3store.writer._ingest import decode_sglang, decode_vllm, encode_sglang
from r3store.writer._writer import RouteWriter

__all__ = ["RouteWriter", "WriterConfig", "WriterConfigDict", "decode_sglang", "decode_vllm", "encode_sglang"]
