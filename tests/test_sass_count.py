"""bench/sass_count.py: the SASS counter, on a hand-written listing and on a kernel compiled offline."""

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

_LISTING = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;                          /* 0x00000a00ff017b82 */
                                                                                   /* 0x000fe20000000800 */
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;                /* 0x0000000402047981 */
        /*0020*/               @!P0 BRA 0x60 ;                                     /* 0x0000000000007947 */
        /*0030*/                   STG.E.64 desc[UR4][R2.64], R4 ;                 /* 0x0000000402007986 */
        /*0040*/               @P1 STG.E.U8 desc[UR4][R6.64], R8 ;                 /* 0x0000000806007986 */
        /*0050*/                   EXIT ;                                          /* 0x000000000000794d */
        /*0060*/                   BRA 0x60;                                       /* 0x0000000000007947 */
        /*0070*/                   NOP;                                            /* 0x0000000000007918 */
"""


def test_counts_a_listing_without_padding_or_the_trailing_self_branch():
    import sass_count

    counts = sass_count.count_sass(_LISTING)
    # predicated instructions count, an inner branch counts, NOP padding and the final BRA do not
    assert counts == {"instructions": 6, "loads": ["LDG.E.128"], "stores": ["STG.E.64", "STG.E.U8"],
                      "ldg": 1, "stg": 2}


@pytest.mark.slow
def test_counts_the_shipped_mxfp4_quantize_for_sm90():
    import sass_count
    from tritonwarm.jit.pipeline.resources import cuobjdump

    if cuobjdump() is None:
        pytest.skip("this Triton ships no cuobjdump")
    name, jit, launch, elements = sass_count.fp4_cases(2048, include_variants=False)[0]
    sass, usage = sass_count.compile_sass(jit, launch, "sm90")
    counts = sass_count.count_sass(sass)
    addressed = len(re.findall(r"/\*[0-9a-f]{4}\*/", sass))
    assert 0 < counts["instructions"] < addressed and "EXIT" in sass
    assert counts["ldg"] >= 1 and all(op.startswith("LDG") for op in counts["loads"])
    assert counts["stg"] >= 2 and "STG.E.U8" in counts["stores"]  # one scale byte per block of 32
    assert usage is not None and usage["local"] == 0


def test_a_case_that_fails_to_compile_is_a_full_width_row(capsys):
    import sass_count
    from _common import table

    class Broken:
        def fake_run(self, launch):
            raise RuntimeError("no such kernel\nsecond line")

        class jit_function:  # noqa: N801 - stands in for the JITFunction attribute
            device_caches: dict = {}

    rows = sass_count.rows_for([("broken", Broken(), None, 16)], "sm90")
    assert rows == [["broken", "failed: RuntimeError: no such kernel", *["-"] * (len(sass_count.HEADER) - 2)]]
    table("t", sass_count.HEADER, rows, "cmd")  # the table takes it
    assert "no such kernel" in capsys.readouterr().out


_LOOP = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0020*/                   IMAD R3, R2, 0x2, RZ ;
        /*0030*/                   LDGSTS.E.BYPASS.128 [R6], desc[UR4][R8.64] ;
        /*0038*/              @!UPT UIADD3 URZ, URZ, URZ, URZ ;
        /*0040*/               @!P0 BRA 0x20 ;
        /*0050*/                   EXIT ;
        /*0060*/                   BRA 0x60;
"""


_NESTED = """
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0020*/               @!P0 BRA 0x10 ;
        /*0030*/                   FMUL R5, R5, R6 ;
        /*0040*/               @!P1 BRA 0x30 ;
        /*0050*/               @!P2 BRA 0x0 ;
        /*0060*/                   EXIT ;
"""


def test_token_loop_is_the_first_innermost_loop():
    import sass_count

    # the loop runs 0x20..0x40: IMAD, LDGSTS and the branch; the load before it, the padding under a
    # never-true predicate and the final self-branch (a forward-or-self jump, not a loop back) are not
    assert sass_count.token_loop(_LOOP) == ["IMAD", "LDGSTS.E.BYPASS.128", "BRA"]
    assert sass_count.token_loop(_LISTING) == []
    # two inner loops (whole tiles, then the partial one) in an outer loop: the first inner one
    assert sass_count.token_loop(_NESTED) == ["HMMA.16816.F32.BF16", "BRA"]


@pytest.mark.slow
def test_mla_token_loop_reads_one_block_id_per_tile():
    """A 64-token tile of MLA on 64-token pages is one page's slots: the sm90 token loop loads one block
    id (not one per token) and copies the tile with cp.async, with no spills."""
    import sass_count
    from tritonwarm.jit.pipeline.resources import cuobjdump

    if cuobjdump() is None:
        pytest.skip("this Triton ships no cuobjdump")
    mla = next(r for r in sass_count.attention_rows("sm90") if r[1].startswith("MLA"))
    header = dict(zip(sass_count.ATTENTION_HEADER, mla, strict=True))
    assert header["loop LDG"] == 1 and header["loop LDGSTS"] > 0 and header["spill B"] == 0, header


@pytest.mark.slow
def test_the_mxfp4_moe_loop_decodes_words_into_warpgroup_mmas_on_sm90():
    """The FP4 MoE K loop as compiled for sm90: the packed weights arrive through cp.async in 8- or
    16-byte pieces, byte loads only for the scales (one per 32 weight elements), the transposed
    16-token tile runs HGMMA, no spills, and the loop stays under 8 instructions per weight element
    (the nibble-at-a-time decode took 17.9)."""
    import sass_count
    from tritonwarm.jit.pipeline.resources import cuobjdump

    if cuobjdump() is None:
        pytest.skip("this Triton ships no cuobjdump")
    [row] = sass_count.moe_rows("sm90", tiles=("16x128x128 w4 s3",), formats=("mxfp4",))
    header = sass_count.MOE_HEADER
    cells = dict(zip(header, row, strict=True))
    assert float(cells["instr/weight elem"]) < 8.0, row
    assert "LDGSTS.E.64" in cells["weight loads"] or "LDGSTS.E.128" in cells["weight loads"], row
    per_thread = 2 * 128 * 128 / 128  # gate and up tiles, 4 warps
    assert cells["LDG.E.U8"] <= per_thread / 32 and "HGMMA" in cells["MMA"] and cells["spill B"] == 0, row


@pytest.mark.slow
def test_quantized_mla_token_loops_read_whole_words_and_stay_near_bf16():
    """sm90: each quantized format's token loop loads the cache in 128-bit words (no byte loads),
    spills nothing, and issues at most 2.5x bf16's warp-instructions a token (the per-element fp32
    dequantization it replaces issued over 20x)."""
    import sass_count
    from tritonwarm.jit.pipeline.resources import cuobjdump

    if cuobjdump() is None:
        pytest.skip("this Triton ships no cuobjdump")
    rows = {r[0]: dict(zip(sass_count.MLA_HEADER, r, strict=True)) for r in sass_count.mla_rows("sm90")}
    bf16 = float(rows["auto"]["warp-instr/token"])
    for name in ("fp8_ds_mla", "nvfp4_ds_mla"):
        row = rows[name]
        assert row["byte loads/tile"] == 0 and row["128-bit loads/tile"] > 0 and row["spill B"] == 0, row
        assert row["MMA/tile"] > 0 and float(row["warp-instr/token"]) <= 2.5 * bf16, row


def test_mla_row_counts_a_listing():
    import sass_count

    listing = """
        /*0000*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0010*/                   LDGSTS.E.BYPASS.128 [R6], desc[UR4][R8.64] ;
        /*0020*/                   LDS.U8 R3, [R6] ;
        /*0030*/                   F2FP.F16.E4M3.UNPACK_B R5, R4 ;
        /*0040*/                   HMUL2 R5, R5, R6 ;
        /*0050*/                   HMMA.16816.F32 R8, R4, R6, R8 ;
        /*0060*/               @!P0 BRA 0x10 ;
        /*0070*/                   EXIT ;
"""
    row = dict(zip(sass_count.MLA_HEADER, sass_count.mla_row("x", 64, listing, {"registers": 128, "local": 0,
                                                                              "shared": 65536}, 16, 4, 2), strict=True))
    # the loop is 0x10..0x60: six instructions, four warps, 16 tokens of 64 bytes
    assert row["loop instr"] == 6 and row["warp-instr/token"] == "1.5"
    assert (row["128-bit loads/tile"], row["byte loads/tile"], row["MMA/tile"]) == (4, 4, 4)
    assert row["dequant instr/byte"] == f"{32 * 8 / (16 * 64):.2f}"  # F2FP and HMUL2, 4 warps
    assert row["stage KB"] == "1.0" and row["shared KB"] == "64.0" and row["CTAs/SM"] == 3  # 233472 // 65536
