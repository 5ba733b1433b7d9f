"""The twin's own rules, each shown by a probe kernel (tests/ascend/twin_probes.cpp): code that follows the AscendC
contract runs clean with the right values, code that breaks one rule is reported, naming the rule. A twin that let
these pass would prove nothing about the kernels."""
import pytest
import torch

CLEAN = ["ok_pipeline", "ok_localtensor_semantics", "ok_tque", "ok_syncall", "ok_atomic_add", "ok_reduce",
         "mm_ok_partial_tile_orgN_stride", "mm_ok_partial_tile_sequential_stride", "ok_row_reductions", "ok_xflag_ring",
         "ok_xflag_mode0_mode1", "ok_syncall_mix", "ok_mm_orgshape_leading_dim"]
VIOLATIONS = {
    "raw_mte2_v": "HardEvent::MTE2_V",
    "raw_v_s": "HardEvent::V_S",
    "raw_s_v": "HardEvent::S_V",
    "war_v_mte2": "write after read",
    "raw_s_mte3": "HardEvent::S_MTE3",
    "raw_v_v": "PipeBarrier<PIPE_V>",
    "waitflag_without_setflag": "would wait forever",
    "setflag_twice": "twice without a WaitFlag",
    "setflag_never_waited": "never waited",
    "unaligned_operand": "not 32-byte aligned",
    "count_beyond_tensor": "exceed its LocalTensor length",
    "datacopy_not_32b": "not a multiple of 32",
    "gm_read_past_allocation": "past the end of in",
    "gm_write_input": "write of 32 bytes to the input",
    "tpipe_over_capacity": "exceed the unified buffer",
    "missing_syncall": "no SyncAll or CrossCoreSetFlag",
    "scalar_stores_share_cache_line": "shares a 64-byte cache line",
    "scalar_store_not_written_back": "still in the data cache",
    "syncall_deadlock": "deadlock",
    "cast_mode_unsupported": "not supported on Atlas A2",
    "tanh_in_place": "overlap",
    "reduce_tmp_too_small": "sharedTmpBuffer",
    "mm_getc_short_tensor": "fewer than baseM * baseN",
    "mm_tail_k_reads_past_b": "past the end of in",
    "level0_beyond_tensor": "beyond its LocalTensor length",
    "compare_partial_repeat": "not a multiple of 256",
    "xflag_missing_wait": "cross-core race",
    "xflag_missing_free": "cross-core race on GM out",  # WAR on the slot or RAW of the tile after it
    "xflag_set_on_wrong_pipe": "write after read",
    "xflag_never_waited": "never waited",
    "xflag_deadlock": "deadlock",
    "xflag_mode1_unmatched": "deadlock",
    "xflag_counter_overflow": "exceed 15",
    "xflag_id_out_of_range": "outside 0..15",
    "xflag_mode4_not_on_a2": "not supported on Atlas A2",
    "xflag_ids_of_syncall": "ids 11..14",
    "xflag_aiv_only_kernel": "needs a MIX kernel type",
    "matmulimpl_on_vector_core": "MatmulImpl runs on the cube core",
    "syncall_mix_missing": "cross-core race on GM out",
}


def test_every_probe_is_tested(ops):
    assert set(ops._twin_probe_names()) == set(CLEAN) | set(VIOLATIONS)


@pytest.mark.parametrize("name", CLEAN)
def test_clean_probe(ops, name):
    assert ops._twin_probe(name) == ""


@pytest.mark.parametrize("name", sorted(VIOLATIONS))
def test_violation_is_reported(ops, name):
    msg = ops._twin_probe(name)
    assert msg.startswith("twin ERROR"), msg
    assert VIOLATIONS[name] in msg, msg


def test_cast_rounds_to_nearest_even_like_torch(ops, seed):
    """bf16 / fp16 conversions are bit-exact round-to-nearest-even, including ties, subnormals, overflow and NaN."""
    x = torch.cat([torch.randn(4000) * 10.0 ** torch.randint(-8, 6, (4000,)).float(),
                   torch.tensor([0.0, -0.0, 1e-40, -1e-42, 6e-8, 3e-8, 65504.0, 65520.0, 1e30, float("inf"),
                                 -float("inf"), float("nan"), 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-11,
                                 1.0 + 3 * 2**-11])])
    x = torch.cat([x, torch.zeros((-x.numel()) % 16)])
    b, h = ops._twin_cast(x)
    eb, eh = x.bfloat16(), x.half()
    assert torch.equal(b.view(torch.int16)[~eb.isnan()], eb.view(torch.int16)[~eb.isnan()])
    assert torch.equal(h.view(torch.int16)[~eh.isnan()], eh.view(torch.int16)[~eh.isnan()])
    assert torch.equal(b.isnan(), eb.isnan()) and torch.equal(h.isnan(), eh.isnan())
