"""The bundled real routing trace (FLAME-MoE-290M; Apache-2.0, see ``flame-moe-290m/NOTICE.md``)."""

from r3store.data._flame import FLAME_SEQ_TOKENS, flame_samples, flame_spec, load_flame

__all__ = ["FLAME_SEQ_TOKENS", "flame_samples", "flame_spec", "load_flame"]
