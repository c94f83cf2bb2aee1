"""GRPO with Rollout Routing Replay in TRL, on CPU, in a minute or two (nothing downloaded).

A randomly initialised tiny Qwen3-MoE (4 layers, 128 experts, top-8) and a word-level
tokenizer built locally learn, by GRPO, to say ``w7`` a lot. ``R3GRPOTrainer`` (TRL's
``GRPOTrainer`` + ``routes_url``) captures every completion's routes during
``model.generate()``, writes them to an r3store store and replays them in the old,
reference and policy log-prob forwards::

    pip install 'r3store[trl]'
    python examples/trl_grpo_r3.py                      # 4 steps into ./grpo-r3
    python examples/trl_grpo_r3.py --steps 2 --output-dir /somewhere

It prints TRL's log lines, among them ``r3/flips`` (decisions that differ from the
rollout's in the replayed forwards: 0) and ``r3/flips_without_replay`` (the trainer's
own routing on a sample of batches), then the store's summary. The routes go to
``<output-dir>/r3-routes``; a folder that already holds routes (an earlier run) is refused,
since a second run would add its rollouts to the same store (pass another ``--output-dir``,
or delete the old one).
"""

from __future__ import annotations

import argparse
import os
import random
from typing import Any


def reward_w7(completions: list[str], **_: Any) -> list[float]:
    """Share of the completion's words that are ``w7``."""
    return [c.split().count("w7") / max(len(c.split()), 1) for c in completions]


def run(output_dir: str, *, steps: int = 4, family: str = "qwen3_moe", seed: int = 0) -> dict[str, Any]:
    """Train ``steps`` GRPO steps; return ``{"history": trainer log history, "routes_url": ..., "samples": ...}``.

    Raises
    ------
    FileExistsError
        ``<output_dir>/r3-routes`` already holds routes (an earlier run): checked before anything
        is written, so one store holds one run's rollouts.
    """
    routes_dir = os.path.join(output_dir, "r3-routes")  # R3GRPOTrainer's default routes_url
    if os.path.isdir(routes_dir) and os.listdir(routes_dir):
        raise FileExistsError(f"{routes_dir} already holds the routes of an earlier run; a new run would add its "
                              "rollouts to the same store: pass another --output-dir, or delete that folder")
    import torch
    from datasets import Dataset
    from trl import GRPOConfig

    from r3store import open_store
    from r3store.testing.moe import tiny_moe, tiny_tokenizer
    from r3store.trl import R3GRPOTrainer

    tokenizer = tiny_tokenizer(words=64)
    model_dir = os.path.join(output_dir, "tiny-model")  # saved so that TRL can load the reference model too
    tiny_moe(family, seed=seed, vocab_size=len(tokenizer)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    rng = random.Random(seed)
    prompts = [" ".join(f"w{rng.randrange(64)}" for _ in range(rng.randrange(3, 9))) for _ in range(32)]
    args = GRPOConfig(
        output_dir=output_dir, max_steps=steps, per_device_train_batch_size=4, num_generations=4,
        steps_per_generation=2, max_completion_length=8, learning_rate=1e-3, beta=0.04, temperature=1.0,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False, seed=seed,
        activation_checkpointing=True, dataloader_num_workers=0, model_init_kwargs={"dtype": "float32"})
    torch.manual_seed(seed)
    trainer = R3GRPOTrainer(model=model_dir, reward_funcs=reward_w7, args=args,
                            train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tokenizer)
    trainer.flips_sample_every = 1  # measure the trainer's own routing on every batch (default: every 4th)
    trainer.train()
    store = open_store(trainer.routes_url)
    return {"history": trainer.state.log_history, "routes_url": trainer.routes_url,
            "samples": len(store.sample_ids), "trainer": trainer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="grpo-r3")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--family", default="qwen3_moe")
    opts = parser.parse_args()
    from r3store.testing.moe import one_thread

    with one_thread():  # tiny model: OpenMP threads only compete
        try:
            result = run(opts.output_dir, steps=opts.steps, family=opts.family)
        except FileExistsError as exc:
            parser.error(str(exc))
    for entry in result["history"]:
        shown = {k: round(v, 4) for k, v in entry.items() if k.startswith(("r3/", "reward", "loss", "kl"))}
        if shown:
            print(f"step {entry.get('step')}: {shown}")
    print(f"{result['samples']} rollouts' routes in {result['routes_url']}")


if __name__ == "__main__":
    main()
