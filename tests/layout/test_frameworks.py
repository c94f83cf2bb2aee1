"""``LayoutOptions(framework=...)`` equals each framework's own packing code (issue 18, items 1-2).

Each class runs :class:`r3store.testing.LayoutParity` (TP {1,2,4} x CP {1,2,4} x SP on/off x
every rank, sample lengths of 1, odd and below ``2*cp*tp``) with the framework's packing
function as the oracle: copies under ``tests/layout/oracles/`` (repository, file and commit
in each header), run with torch on CPU.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from r3store.errors import LayoutOptionError  # noqa: E402
from r3store.layout import LayoutOptions, plan_layout  # noqa: E402
from r3store.testing import LayoutParity  # noqa: E402  (first: registers the kits for assert rewriting)
from r3store.testing.layout import GRID, Packed, Unpackable, sp_slice  # noqa: E402
from tests.layout.oracles import (  # noqa: E402
    megatron_packing,
    miles_packing,
    nemo_rl_packing,
    prime_rl_packing,
    skyrl_packing,
    slime_packing,
    verl_packing,
)


def right_padded(values: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, S, ...]`` right-padded batch and its bool attention mask (verl's / SkyRL's input)."""
    width = max(len(v) for v in values)
    ids = torch.zeros((len(values), width, *values[0].shape[1:]), dtype=torch.int64)
    mask = torch.zeros((len(values), width), dtype=torch.bool)
    for i, v in enumerate(values):
        ids[i, : len(v)] = torch.from_numpy(v)
        mask[i, : len(v)] = True
    return ids, mask


class TestVerl(LayoutParity):
    """verl's Megatron path: ``preprocess_packed_seqs`` for tokens and routes, then the SP scatter.

    With CP, verl copies each rank's front chunk from the unpadded sequence: when a sequence
    ends inside or before that chunk (``n < (cp_rank + 1) * padded / (2 * cp)``) the copy
    raises a shape error, or, with one token left, broadcasts it over the whole chunk. verl
    cannot pack such batches; they are not compared here (SkyRL's copy of the same rule pads
    the sequence first and covers them).
    """

    framework = "verl"

    def pack(self, values: list[np.ndarray], options: LayoutOptions) -> Packed:
        cp, r = options.cp_size, options.cp_rank
        align = options.tp_size * cp * 2
        for v in values:
            half = -(-len(v) // align) * align // (2 * cp)
            if cp > 1 and len(v) < half * (r + 1):
                raise Unpackable(f"verl's front-chunk copy fails for a sequence of {len(v)} tokens on CP rank {r}")
        ids, mask = right_padded(values)
        packed, params = verl_packing.preprocess_packed_seqs(ids, mask, pre_process=True, tp_size=options.tp_size,
                                                             cp_size=cp, cp_rank=r)
        return Packed(sp_slice(packed[0].numpy(), options), params["cu_seqlens_q"].numpy())


class TestSkyRL(LayoutParity):
    """SkyRL: ``align_token_metadata`` (packed and unpacked) and the replay TP slice."""

    framework = "skyrl"
    layouts = ("thd", "bshd")

    def supports(self, layout: str, tp_size: int, cp_size: int, sequence_parallel: bool) -> bool:
        # SkyRL TP-slices routes whenever tp > 1; its unpacked path has no CP
        return (tp_size == 1 or sequence_parallel) and (layout == "thd" or cp_size == 1)

    def pack(self, values: list[np.ndarray], options: LayoutOptions) -> Packed:
        ids, mask = right_padded(values)
        layout = skyrl_packing.build_token_metadata_layout(mask, ids.device, packed=options.layout == "thd",
                                                           fp8_enabled=False, tp_size=options.tp_size,
                                                           cp_size=options.cp_size, cp_rank=options.cp_rank)
        aligned = skyrl_packing.align_token_metadata(ids, layout, 0)
        local = skyrl_packing.tp_slice(aligned, tp_size=options.tp_size, tp_rank=options.tp_rank)
        if options.layout == "thd":
            return Packed(local[0].numpy(), layout.cu_seqlens_padded.numpy())
        return Packed(local.numpy())


def _ranks(options: LayoutOptions) -> dict[str, int]:
    return {"tp_size": options.tp_size, "tp_rank": options.tp_rank, "cp_size": options.cp_size,
            "cp_rank": options.cp_rank}


class TestSlime(LayoutParity):
    """slime: ``get_batch`` (tokens, cu_seqlens) and ``prepare_routed_experts_for_routing_replay``."""

    framework = "slime"

    def pack(self, values: list[np.ndarray], options: LayoutOptions) -> Packed:
        slime_packing.set_ranks(**_ranks(options))
        tokens, cu = slime_packing.get_batch_tokens([torch.from_numpy(v) for v in values], options.pad_multiple,
                                                    options.cp_mode == "contiguous")
        return Packed(sp_slice(tokens[0].numpy(), options), cu.numpy())

    def pack_routes(self, routes: list[np.ndarray], options: LayoutOptions) -> np.ndarray:
        slime_packing.set_ranks(**_ranks(options))
        out = slime_packing.prepare_routed_experts_for_routing_replay(
            [torch.from_numpy(r) for r in routes], [torch.zeros(len(r) + 1) for r in routes], num_experts=16,
            data_pad_size_multiplier=options.pad_multiple, sequence_parallel=options.sequence_parallel,
            allgather_cp=options.cp_mode == "contiguous")
        return out.numpy()


class TestSlimeSmallMultiplier(TestSlime):
    """slime with ``--data-pad-size-multiplier 4`` (the default 128 hides the TP padding in small batches)."""

    def options(self, **fields: object) -> LayoutOptions:
        return LayoutOptions(framework="slime", pad_multiple=4, **fields)  # type: ignore[arg-type]


class TestSlimeAllgatherCP(TestSlime):
    """slime ``--allgather-cp``: the packed stream cut into contiguous CP chunks (``cp_mode="contiguous"``)."""

    def options(self, **fields: object) -> LayoutOptions:
        return LayoutOptions(framework="slime", cp_mode="contiguous", pad_multiple=2, **fields)  # type: ignore[arg-type]


class TestMiles(LayoutParity):
    """Miles: ``get_batch`` (THD; BSHD at ``get_rollout_data``'s length) and ``fill_replay_data``."""

    framework = "miles"
    layouts = ("thd", "bshd")

    def supports(self, layout: str, tp_size: int, cp_size: int, sequence_parallel: bool) -> bool:
        return layout == "thd" or not (sequence_parallel and tp_size > 1)  # BSHD + SP: not covered (see docs)

    def options(self, **fields: object) -> LayoutOptions:
        return LayoutOptions(framework="miles", pad_multiple=2, **fields)  # type: ignore[arg-type]

    def _args(self, options: LayoutOptions) -> SimpleNamespace:
        return SimpleNamespace(qkv_format=options.layout, data_pad_size_multiplier=options.pad_multiple,
                               compress_ratios=None, allgather_cp=options.cp_mode == "contiguous",
                               sequence_parallel=options.sequence_parallel)

    def _batch(self, values: list[torch.Tensor], lengths: list[int], options: LayoutOptions) -> dict[str, object]:
        batch: dict[str, object] = {"tokens": values}
        if options.layout == "bshd":  # the rollout's longest sample, rounded up by get_rollout_data
            batch["max_seq_lens"] = [miles_packing.rollout_max_seq_len({"total_lengths": lengths},
                                                                       self._args(options))] * len(values)
        return batch

    def pack(self, values: list[np.ndarray], options: LayoutOptions) -> Packed:
        miles_packing.set_ranks(**_ranks(options))
        batch = self._batch([torch.from_numpy(v) for v in values], [len(v) for v in values], options)
        tokens, cu = miles_packing.get_batch_tokens(batch, options.pad_multiple, options.layout,
                                                    options.cp_mode == "contiguous")
        if options.layout == "thd":
            return Packed(sp_slice(tokens[0].numpy(), options), cu.numpy())
        return Packed(tokens.numpy())

    def pack_routes(self, routes: list[np.ndarray], options: LayoutOptions) -> np.ndarray:
        miles_packing.set_ranks(**_ranks(options))
        tokens = [torch.zeros(len(r) + 1) for r in routes]
        batch = self._batch(tokens, [len(t) for t in tokens], options)
        batch["rollout_routed_experts"] = [torch.from_numpy(r) for r in routes]
        out = miles_packing.fill_replay_data_one_microbatch(batch, self._args(options))
        if options.layout == "bshd":  # fill_replay_data flattens the [B, S] rows; r3store keeps (B, T)
            return out.reshape(len(routes), -1, *out.shape[1:]).numpy()
        return out.numpy()


class TestMilesAllgatherCP(TestMiles):
    """Miles ``--allgather-cp`` (THD; its BSHD all-gather CP is not covered)."""

    layouts = ("thd",)

    def options(self, **fields: object) -> LayoutOptions:
        return LayoutOptions(framework="miles", cp_mode="contiguous", pad_multiple=2, **fields)  # type: ignore[arg-type]


class TestNemoRL(LayoutParity):
    """NeMo-RL: ``_pack_sequences_for_megatron``, ``_shard_routed_experts_for_cp``, ``_split_for_sequence_parallel``."""

    framework = "nemo_rl"

    def pack(self, values: list[np.ndarray], options: LayoutOptions) -> Packed:
        ids, _ = right_padded(values)
        lengths = torch.tensor([len(v) for v in values])
        pad_factor, pad_packed_multiple, pad_packed_to = nemo_rl_packing._get_pack_sequence_parameters_for_megatron(
            {"tensor_model_parallel_size": options.tp_size, "sequence_parallel": options.sequence_parallel,
             "pipeline_model_parallel_size": 1, "context_parallel_size": options.cp_size},
            options.pad_multiple, int(lengths.max()))
        _, packed, params, _, _ = nemo_rl_packing._pack_sequences_for_megatron(
            ids, lengths, pad_factor, pad_packed_multiple, pad_packed_to, cp_rank=options.cp_rank,
            cp_size=options.cp_size)
        local = nemo_rl_packing._split_for_sequence_parallel(
            packed[0], sequence_parallel=options.sequence_parallel, tp_size=options.tp_size, tp_rank=options.tp_rank)
        return Packed(local.numpy(), params["cu_seqlens_q"].numpy())

    def pack_routes(self, routes: list[np.ndarray], options: LayoutOptions) -> np.ndarray:
        # NeMo-RL's routes are per token ([B, S, L, K], the last token's row a dummy): one row appended
        full = [np.concatenate((r, np.arange(4)[None, None, :].repeat(r.shape[1], 1))) for r in routes]
        ids, _ = right_padded(full)
        lengths = torch.tensor([len(v) for v in full])
        pad_factor, pad_packed_multiple, pad_packed_to = nemo_rl_packing._get_pack_sequence_parameters_for_megatron(
            {"tensor_model_parallel_size": options.tp_size, "sequence_parallel": options.sequence_parallel,
             "pipeline_model_parallel_size": 1, "context_parallel_size": options.cp_size},
            options.pad_multiple, int(lengths.max()))
        tokens = torch.zeros(ids.shape[:2], dtype=torch.int64)
        _, _, _, cu, cu_padded = nemo_rl_packing._pack_sequences_for_megatron(
            tokens, lengths, pad_factor, pad_packed_multiple, pad_packed_to, cp_rank=options.cp_rank,
            cp_size=options.cp_size)
        _, routed, _, _ = nemo_rl_packing._shard_routed_experts_for_cp(
            ids, None, lengths, cu, cu_padded if pad_factor > 1 else None, options.cp_rank, options.cp_size)
        local = nemo_rl_packing._split_for_sequence_parallel(
            routed[0], sequence_parallel=options.sequence_parallel, tp_size=options.tp_size, tp_rank=options.tp_rank)
        return local.numpy()


class TestPrimeRL(LayoutParity):
    """prime-rl: ``pad_micro_batch`` then ``shard_for_cp`` (FSDP: no TP)."""

    framework = "prime_rl"

    def supports(self, layout: str, tp_size: int, cp_size: int, sequence_parallel: bool) -> bool:
        return tp_size == 1

    def pack(self, values: list[np.ndarray], options: LayoutOptions) -> Packed:
        batch = prime_rl_packing.micro_batch(np.concatenate(values).tolist(), [len(v) for v in values])
        batch = prime_rl_packing.pad_micro_batch(batch, options.pad_multiple)
        ids = torch.tensor(batch.input_ids).unsqueeze(0)
        cu, _ = prime_rl_packing.get_cu_seqlens_from_seq_lens(torch.tensor(batch.sequence_lengths),
                                                              total_tokens=ids.shape[-1])
        if options.cp_size > 1:
            ids = prime_rl_packing.shard_for_cp(ids, cp_rank=options.cp_rank, cp_world_size=options.cp_size)
        return Packed(ids[0].numpy(), cu.numpy())

    def pack_routes(self, routes: list[np.ndarray], options: LayoutOptions) -> np.ndarray:
        # the orchestrator zero-pads each sample's routes to len(input_ids) rows (_encode_routed_experts)
        full = [np.concatenate((r, np.zeros((1, *r.shape[1:]), r.dtype))) for r in routes]
        batch = prime_rl_packing.micro_batch([0] * sum(len(r) for r in full), [len(r) for r in full],
                                             np.concatenate(full))
        batch = prime_rl_packing.pad_micro_batch(batch, options.pad_multiple)
        experts = torch.from_numpy(prime_rl_packing.routed_array(batch).copy()).unsqueeze(0)
        if options.cp_size > 1:
            experts = prime_rl_packing.shard_for_cp(experts, cp_rank=options.cp_rank, cp_world_size=options.cp_size)
        return experts[0].numpy()


class TestMegatron(LayoutParity):
    """Megatron-core: ``_get_batch_on_this_cp_rank_per_sequence_balancing`` then the SP scatter along S."""

    framework = "megatron"
    layouts = ("bshd", "sbhd")

    def pack(self, values: list[np.ndarray], options: LayoutOptions) -> Packed:
        # Megatron pads nothing: the batch comes at the length r3store's rule picks (checked below)
        length = plan_layout([len(v) for v in values], options).index.shape[0 if options.layout == "sbhd" else -1]
        length *= options.cp_size * (options.tp_size if options.sequence_parallel else 1)
        ids = torch.zeros((len(values), length), dtype=torch.int64)
        for i, v in enumerate(values):
            ids[i, : len(v)] = torch.from_numpy(v)
        batch = megatron_packing._get_batch_on_this_cp_rank_per_sequence_balancing(
            {"tokens": ids}, cp_size=options.cp_size, cp_rank=options.cp_rank)
        tokens = batch["tokens"].numpy()
        if options.layout == "sbhd":  # the embedding's [S, B] order, then the SP scatter along S
            return Packed(sp_slice(tokens.T, options, axis=0))
        return Packed(sp_slice(tokens, options, axis=1))

    def pack_routes(self, routes: list[np.ndarray], options: LayoutOptions) -> np.ndarray:
        full = [np.concatenate((r, np.zeros((1, *r.shape[1:]), r.dtype))) for r in routes]
        length = plan_layout([len(v) for v in full], options).index.shape[0 if options.layout == "sbhd" else -1]
        length *= options.cp_size * (options.tp_size if options.sequence_parallel else 1)
        ids = torch.zeros((len(full), length, *full[0].shape[1:]), dtype=torch.int64)
        for i, v in enumerate(full):
            ids[i, : len(v)] = torch.from_numpy(v)
        out = megatron_packing._get_batch_on_this_cp_rank_per_sequence_balancing(
            {"tokens": ids}, cp_size=options.cp_size, cp_rank=options.cp_rank)["tokens"].numpy()
        if options.layout == "sbhd":
            return sp_slice(out.transpose(1, 0, 2, 3), options, axis=0)
        return sp_slice(out, options, axis=1)


def test_megatron_length_is_the_least_megatron_accepts() -> None:
    """Megatron-core pads nothing: r3store's row length is the least one its CP cut (2*cp chunks)
    and SP scatter (tp parts of the CP-local rows) divide."""
    for cp in (1, 2, 4):
        for tp in (1, 2, 4):
            opts = LayoutOptions(framework="megatron", layout="bshd", cp_size=cp, tp_size=tp, sequence_parallel=True)
            for longest in range(1, 40):
                t = plan_layout([longest], opts).index.shape[-1] * cp * tp
                assert t >= longest
                assert t % (2 * cp if cp > 1 else 1) == 0
                assert (t // cp) % tp == 0
                assert not any(s % (2 * cp if cp > 1 else 1) == 0 and (s // cp) % tp == 0 for s in range(longest, t))


def test_verl_misalignment_of_the_default_rule_is_gone() -> None:
    """The issue's case: TP=2, CP=1 packs 50 rows in verl (48 by r3store's default rule)."""
    lengths = [7, 9, 3, 11, 5, 13]  # six odd lengths: verl pads each to 2
    ids, mask = right_padded([np.arange(n) for n in lengths])
    packed, _ = verl_packing.preprocess_packed_seqs(ids, mask, tp_size=2, cp_size=1, cp_rank=0)
    assert plan_layout(lengths, LayoutOptions(framework="verl", tp_size=2)).index.shape[0] == packed.shape[1] == 54
    assert plan_layout(lengths, LayoutOptions(tp_size=2)).index.shape[0] == 48


@pytest.mark.parametrize(("fields", "option"), [
    ({"framework": "unsloth"}, "framework"),
    ({"framework": "verl", "layout": "bshd"}, "layout"),
    ({"framework": "megatron"}, "layout"),
    ({"framework": "verl", "pad_multiple": 4}, "pad_multiple"),
    ({"framework": "verl", "cp_size": 2, "cp_mode": "contiguous"}, "cp_mode"),
    ({"framework": "skyrl", "tp_size": 2}, "sequence_parallel"),
    ({"framework": "skyrl", "layout": "bshd", "cp_size": 2}, "cp_size"),
    ({"framework": "miles", "layout": "bshd", "tp_size": 2, "sequence_parallel": True}, "sequence_parallel"),
    ({"framework": "nemo_rl", "cp_size": 2, "pad_multiple": 2}, "pad_multiple"),
    ({"framework": "prime_rl", "tp_size": 2}, "tp_size"),
    ({"framework": "prime_rl", "cp_size": 4, "pad_multiple": 6}, "pad_multiple"),
])
def test_options_a_framework_cannot_run_are_refused(fields: dict[str, object], option: str) -> None:
    with pytest.raises(LayoutOptionError, match=option):
        LayoutOptions(**fields)  # type: ignore[arg-type]


def test_framework_defaults_and_round_trip() -> None:
    assert LayoutOptions().pad_multiple == 1
    assert LayoutOptions(framework="slime").pad_multiple == 128
    assert LayoutOptions(framework="miles", pad_multiple=4).pad_multiple == 4
    assert LayoutOptions(framework="nemo_rl", cp_size=2, tp_size=2, sequence_parallel=True).pad_multiple == 8
    assert LayoutOptions(framework="prime_rl", cp_size=4).pad_multiple == 4
    opts = LayoutOptions(framework="verl", tp_size=2, cp_size=2, ep_size=8)
    assert LayoutOptions.from_dict(opts.to_dict()) == opts
    assert LayoutOptions.resolve({"framework": "verl"}, tp_size=2).framework == "verl"


KITS = [TestVerl(), TestSkyRL(), TestSlimeSmallMultiplier(), TestSlimeAllgatherCP(), TestMiles(),
        TestMilesAllgatherCP(), TestNemoRL(), TestPrimeRL(), TestMegatron()]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_random_batches_equal_framework(data: st.DataObject) -> None:
    """Random batches (1..12 samples of 1..90 tokens), sizes and ranks, every framework."""
    kit = data.draw(st.sampled_from(KITS), label="framework")
    tp, cp, sp = data.draw(st.sampled_from(GRID), label="tp, cp, sp")
    layout = data.draw(st.sampled_from(kit.layouts), label="layout")
    assume(kit.supports(layout, tp, cp, sp))
    opts = kit.options(layout=layout, tp_size=tp, tp_rank=data.draw(st.integers(0, tp - 1)), cp_size=cp,
                       cp_rank=data.draw(st.integers(0, cp - 1)), sequence_parallel=sp)
    lengths = data.draw(st.lists(st.integers(1, 90), min_size=1, max_size=12), label="lengths")
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    try:
        packed = kit.pack([np.arange(o, o + n, dtype=np.int64) + 2 for o, n in zip(offsets, lengths, strict=True)],
                          opts)
    except Unpackable:
        assume(False)
    plan = plan_layout(lengths, opts)
    np.testing.assert_array_equal(plan.index, np.where(packed.values >= 2, packed.values - 2, -1))
    if packed.cu_seqlens is not None:
        np.testing.assert_array_equal(plan.cu_seqlens, packed.cu_seqlens)


def test_framework_and_ep_size_reach_store_assemble_and_route_dataset(tmp_path) -> None:
    """The fields travel inside the options object: RouteStore.assemble and RouteDataset batches
    equal batch.assemble's with the same options (verl at TP=2 CP=2 SP, EP=4 pad rows)."""
    import r3store
    from r3store.batch import assemble

    spec = r3store.ModelSpec(num_layers=2, num_experts=16, top_k=2)
    rng = np.random.default_rng(1)
    with r3store.RouteWriter(tmp_path / "s", spec, config={"chunk_rows": 8}) as writer:
        for i, n in enumerate([9, 1, 30, 5, 17, 64]):
            writer.append(f"s{i}", np.argsort(rng.random((n - 1, 2, 16)), -1)[..., :2].astype(np.int32), num_tokens=n)
    opts = LayoutOptions(framework="verl", tp_size=2, tp_rank=1, cp_size=2, cp_rank=1, sequence_parallel=True,
                         ep_size=4)
    store = r3store.open_store(tmp_path / "s")
    ids = ["s2", "s0", "s5"]
    want = assemble(store, ids, opts)
    got = store.assemble(ids, opts)
    for key in ("routes", "replay_mask", "cu_seqlens"):
        np.testing.assert_array_equal(got[key], want[key])
    assert want["cu_seqlens"].tolist() == [0, 32, 48, 112]  # verl pads each sequence to 2*tp*cp = 8
    ds = r3store.RouteDataset(tmp_path / "s", max_tokens_per_batch=70, options=opts)
    batches = list(ds)
    assert len(batches) > 1
    for batch in batches:
        ref = assemble(store, batch["sample_ids"], opts)
        np.testing.assert_array_equal(batch["routes"].numpy(), ref["routes"])
        np.testing.assert_array_equal(batch["cu_seqlens"].numpy(), ref["cu_seqlens"])


def test_framework_pad_multiple_default_follows_the_sizes_through_resolve() -> None:
    """NeMo-RL's default depends on cp/tp/sp: merging sizes in takes it anew, a given one stays."""
    opts = LayoutOptions.resolve({"framework": "nemo_rl", "cp_size": 2}, tp_size=2, sequence_parallel=True)
    assert opts.pad_multiple == 8
    base = LayoutOptions(framework="slime", cp_size=2)
    assert base.to_dict()["pad_multiple"] is None
    assert LayoutOptions.resolve(base, tp_size=4, pad_multiple=2).pad_multiple == 2
    assert LayoutOptions.resolve(LayoutOptions(framework="slime", pad_multiple=4), tp_size=2).pad_multiple == 4
    nemo = LayoutOptions(framework="nemo_rl", cp_size=2)
    assert LayoutOptions.resolve(nemo, tp_size=4, sequence_parallel=True).pad_multiple == 16
    assert LayoutOptions().to_dict()["pad_multiple"] is None
    assert LayoutOptions().pad_multiple == 1
