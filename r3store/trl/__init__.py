"""Rollout Routing Replay in TRL (``pip install 'r3store[trl]'``: trl>=1.16,<1.17).

:class:`R3GRPOTrainer` is TRL's ``GRPOTrainer`` with one added argument, ``routes_url``:
the routes each completion used during generation by transformers
(``use_vllm=False``) are captured, written to an r3store store and replayed in every
log-prob forward (old, reference, policy)::

    from r3store.trl import R3GRPOTrainer

    trainer = R3GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(...), train_dataset=ds,
                            processing_class=tokenizer)          # routes_url: <output_dir>/r3-routes
    trainer.train()                                               # logs r3/flips, r3/flips_without_replay

``import r3store`` never imports this package (nor trl).
"""

from r3store.trl._grpo import SUPPORTED_TRL, R3GRPOTrainer

__all__ = ["R3GRPOTrainer", "SUPPORTED_TRL"]

R3GRPOTrainer.__module__ = "r3store.trl"
