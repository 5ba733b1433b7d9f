"""The twin's own rules, each shown by a probe kernel (tests/support/ascendc_twin/ext/probes.cpp): code that
follows the AscendC contract runs clean with the right values, code that breaks one rule is reported, naming
the rule. A twin that let these pass would prove nothing about the kernels."""
import pytest
import torch

CLEAN = ["ok_pipeline", "ok_localtensor_semantics", "ok_tque", "ok_syncall", "ok_atomic_add", "ok_reduce",
         "mm_ok_partial_tile_orgN_stride", "mm_ok_partial_tile_sequential_stride", "ok_row_reductions",
         "ok_xflag_ring", "ok_xflag_mode0_mode1", "ok_syncall_mix", "ok_mm_orgshape_leading_dim",
         "ok_mm_wide_stride_intrinsics_check", "ok_mm_overlay_with_end", "ok_mm_l1_reuse",
         "ok_mm_iterate_order", "ok_mm_l1_partial_residency", "ok_mm_l1_stale_operand",
         "ok_mm_keep_a_resident_fp32_align", "ok_mm_l1_a_kept_over_set_tensor_b", "ok_client_shared_l1",
         "ok_mm_l1_block_sizes"]
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
    # field widths and the Matmul model (docs/npu-twin-rules.md: one row per rule)
    "cube_wide_stride_default_config": "Nd2NzParams::srcDValue = 70000 does not fit its field "
                                       "(16-bit unsigned",
    "cube_stride_65535_default_config": "copy it with MatmulConfig::intrinsicsCheck",
    "cube_looped_copy_offset": "overflows its int32",
    "field_copy_count": "DataCopyParams::blockLen (count * sizeof(T) / 32) = 75000 does not fit",
    "field_pad_left": "DataCopyPadExtParams::leftPadding = 300 does not fit its field (8-bit",
    "cube_overlay_missing_end": "became live at probes.cpp:",
    "absent_optional_by_address": "placeholder address of an absent optional argument",
    "field_copyext_blockcount": "DataCopyExtParams::blockCount = 65540 does not fit its field "
                                "(16-bit unsigned",
    "field_copyext_blocklen_range": "DataCopyExtParams::blockLen = 2097152 is outside its documented range",
    "field_copy_params_blockcount": "DataCopyParams::blockCount = 4096 is outside its "
                                    "documented range [1, 4095]",
    "field_binary_repeat_stride": "BinaryRepeatParams::dstRepStride = 256 does not fit its field (8-bit",
    "field_repeat_time": "repeatTime = 256 does not fit its field (8-bit",
    "field_reduce_repeat_stride": "srcRepStride = 70000 is outside its documented range [0, 65535]",
    "cube_shape_arg_int32": "tailK = 2147483648 does not fit its field (32-bit signed",
    "cube_tiling_depth_zero": "depths and steps must be > 0",
    "cube_tiling_l0_double_buffer": "L0A needs 131072 bytes > 65536",
    "cube_fixpipe_nsize": "FixpipeParamsV220::nSize = 4112 is outside its documented range [0, 4095]",
    "cube_mdl_depth_not_a_step_multiple": "MDL: depthA1 3 must be stepM * stepKa (2) or twice it",
    "cube_l1_tail_k_beyond_tiling": "has no buffer to copy into",
    "cube_l1_fp32_k_align": "L1 needs 1025024 bytes (depthA1 2, depthB1 1000) > 524288",
    "cube_iterate_after_end_without_restart": "only those restart the scheduler (not End)",
    "client_shared_l1_reuse": "copied into L1 since (at probes.cpp:",
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
    """bf16 / fp16 conversions are bit-exact round-to-nearest-even, including ties, subnormals, overflow and
    NaN."""
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


def test_kernels_pass_field_values_whole():
    """The twin checks a parameter field only when it receives the full value: a kernel that narrowed it
    itself (a cast to an 8- or 16-bit type, the width of CANN's fields) would hide an overflow from every
    field rule. So the kernel sources never cast to those types; they build the structs with parentheses from
    full-width values (a braced list would not compile against the real headers,
    cmake/ascendc_header_check.py)."""
    import glob
    import os
    import re

    root = os.path.join(os.path.dirname(__file__), "..", "..", "csrc", "ascend")
    sources = glob.glob(os.path.join(root, "*", "op_kernel", "*.cpp")) + \
        glob.glob(os.path.join(root, "common", "fused_lce_*_aiv.h"))
    assert len(sources) >= 3  # the two kernels and their vector-core helpers
    for src in sources:
        code = re.sub(r"//[^\n]*", "", open(src).read())
        bad = re.findall(r"static_cast<\s*u?int(?:8|16)_t\s*>", code)
        assert not bad, f"{os.path.basename(src)} narrows a value itself: {bad}"
