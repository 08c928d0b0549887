"""Paged decode attention: the shipped launch against a sweep of tile / warp / stage / split settings.

    python bench/attention_tiles.py [--json attention_tiles.json] [--budget 50]

Per geometry (DeepSeek-V2-Lite MLA 64x2048, 128x8192, 1x4096; Llama-3.1-8B GQA 64x2048, 1x8192):

- the shipped call (``launchers.paged_decode_attention``) as a whole, and its three kernels timed
  alone: the schedule (``mla_decode_metadata``), the split kernel, the combine kernel;
- every variant of the sweep below, split kernel and combine kernel timed separately (the schedule
  is computed once per decode step and shared by all layers, so it is not part of a variant), for
  1, 2 and 4 parts (CTAs per kv head and head tile) per SM. A variant is either the shipped
  schedule-driven split kernel with other constexprs / num_warps / num_stages, or the schedule-free
  per-(request, split) grid kernel with the splits per request the launcher's rule picks
  (``launchers.paged_attention.grid_splits``, printed per row); both through the library's own
  launch specs and ``JitKernel`` objects;
- SDPA on the same K/V stored contiguously (GQA) and a device-to-device copy, both in the same run.

GB/s counts the K/V bytes a decode must read once (MLA: the 576-wide latent; GQA: K and V). Every
variant's output is checked against an fp32 reference before it is timed; a wrong one is reported
as WRONG. The last lines print, per geometry, the best setting as an entry of the declared tile data.

Without a GPU every variant runs once at a tiny size in Triton's interpreter and is checked; nothing
is timed and it exits 0 saying so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _common import table  # noqa: E402

PARTS_PER_SM = (1, 2, 4)


@dataclass(frozen=True)
class Variant:
    """One compiled split-kernel setting. ``kernel``: "schedule" (the shipped one) or "grid"."""

    kernel: str
    block_n: int
    num_warps: int
    num_stages: int
    value_is_key: bool = False
    table_ahead: bool = False

    @property
    def name(self) -> str:
        flags = (" v=k" if self.value_is_key else "") + (" ahead" if self.table_ahead else "")
        return f"{self.kernel} N{self.block_n} w{self.num_warps} s{self.num_stages}{flags}"


# Why each one. MLA ships BLOCK_N 32, 8 warps, 1 stage, the value re-loaded. v=k drops the second
# load. Stages: with the block ids loaded in the same step, Triton 3.6's pipeliner gives K/V only
# (num_stages - 1) // 2 buffers of lookahead (none at 2); "ahead" (block ids carried one step ahead)
# gives num_stages - 1 (sm90 TTGIR: MLA N32 s3 -> 2 buffers, GQA N64 s4 -> 3). 16-token tiles halve
# the shared memory of a stage so deeper pipelines and 2+ CTAs/SM fit; BLOCK_N 64 halves the loop
# trips. "grid" is the schedule-free kernel (no outer request loop, host-chosen splits).
MLA_VARIANTS = [
    Variant("schedule", 32, 8, 1, True),
    Variant("schedule", 32, 8, 2, True),
    Variant("schedule", 32, 8, 3, True, True),
    Variant("schedule", 16, 4, 3, True, True),
    Variant("schedule", 16, 4, 4, True, True),
    Variant("schedule", 64, 8, 2, True, True),
    Variant("grid", 32, 8, 1, True),
    Variant("grid", 32, 8, 3, True, True),
    Variant("grid", 16, 4, 4, True, True),
    Variant("grid", 64, 8, 3, True, True),
]
# GQA ships BLOCK_N 64, 4 warps, 2 stages (one [16, 128] q tile per kv head: 4 of its 16 rows real).
GQA_VARIANTS = [
    Variant("schedule", 64, 4, 3),
    Variant("schedule", 64, 4, 4, table_ahead=True),
    Variant("schedule", 32, 4, 4, table_ahead=True),
    Variant("schedule", 128, 8, 3, table_ahead=True),
    Variant("schedule", 64, 8, 4, table_ahead=True),
    Variant("grid", 64, 4, 2),
    Variant("grid", 64, 4, 4, table_ahead=True),
    Variant("grid", 32, 4, 5, table_ahead=True),
    Variant("grid", 128, 8, 3, table_ahead=True),
]


@dataclass
class Geometry:
    kind: str  # "mla" | "gqa"
    batch: int
    seq: int
    heads: int
    kv_heads: int
    key_dim: int
    value_dim: int
    block_size: int

    @property
    def name(self) -> str:
        return f"{self.kind.upper()} {self.batch}x{self.seq}"

    @property
    def kv_bytes(self) -> int:
        per_token = self.key_dim + (self.value_dim if self.kind == "gqa" else 0)
        return self.batch * self.seq * self.kv_heads * per_token * 2


def geometries(small: bool) -> list[Geometry]:
    if small:  # the real head geometry, tiny batch and length: the same constexprs as on the GPU
        return [Geometry("mla", 2, 100, 16, 1, 576, 512, 64), Geometry("gqa", 2, 40, 32, 8, 128, 128, 16)]
    # Ordered so a budget cut loses the least: each kind's first geometry pays its compiles.
    return [Geometry("mla", 64, 2048, 16, 1, 576, 512, 64), Geometry("gqa", 64, 2048, 32, 8, 128, 128, 16),
            Geometry("mla", 1, 4096, 16, 1, 576, 512, 64), Geometry("gqa", 1, 8192, 32, 8, 128, 128, 16),
            Geometry("mla", 128, 8192, 16, 1, 576, 512, 64)]


class Inputs:
    """Random q and paged cache (shuffled blocks), the reference output, and contiguous K/V."""

    def __init__(self, g: Geometry, dev: str):
        from tritonwarm import launchers as L

        self.g = g
        blocks = -(-g.seq // g.block_size)
        if g.kind == "mla":
            self.layout = L.KVCacheLayout.mla(g.batch * blocks, g.block_size, g.value_dim, g.key_dim - g.value_dim)
        else:
            self.layout = L.KVCacheLayout.gqa(g.batch * blocks, g.block_size, g.kv_heads, g.key_dim)
        gen = torch.Generator(device=dev).manual_seed(0)
        self.kv = torch.randn(self.layout.shape, generator=gen, device=dev).to(torch.bfloat16)
        perm = torch.randperm(g.batch * blocks, generator=gen, device=dev).to(torch.int32)
        self.table = perm.view(g.batch, blocks).contiguous()
        self.lens = torch.full((g.batch,), g.seq, device=dev, dtype=torch.int32)
        self.q = torch.randn(g.batch, g.heads, g.key_dim, generator=gen, device=dev).to(torch.bfloat16)
        self.scale = g.key_dim ** -0.5
        self.v_head_dim = g.value_dim if g.kind == "mla" else None
        # [batch, kv_heads, seq, dim], contiguous
        index = self.table.long()
        self.keys = self.layout.keys(self.kv)[index].flatten(1, 2)[:, :g.seq].transpose(1, 2).contiguous()
        self.values = self.layout.values(self.kv)[index].flatten(1, 2)[:, :g.seq].transpose(1, 2).contiguous()
        self.expected = self.reference()

    def reference(self) -> torch.Tensor:
        g = self.g
        group = g.heads // g.kv_heads
        q = self.q.float().view(g.batch, g.kv_heads, group, g.key_dim)
        out = torch.empty(g.batch, g.kv_heads, group, g.value_dim, device=self.q.device)
        for b in range(g.batch):  # one request at a time keeps the fp32 copies small
            scores = torch.einsum("hgd,hsd->hgs", q[b], self.keys[b].float()) * self.scale
            out[b] = torch.einsum("hgs,hsd->hgd", torch.softmax(scores, -1), self.values[b].float())
        return out.view(g.batch, g.heads, g.value_dim)

    def sdpa(self):
        return F.scaled_dot_product_attention(self.q[:, :, None], self.keys, self.values, scale=self.scale,
                                              enable_gqa=self.g.heads != self.g.kv_heads)[:, :, 0]

    def shipped(self):
        from tritonwarm import launchers as L

        return L.paged_decode_attention(self.q, self.kv, self.table, self.lens, self.scale,
                                        v_head_dim=self.v_head_dim)


def sm_count(dev: str) -> int:
    from tritonwarm.launchers.paged_attention import NOMINAL_SM_COUNT

    return torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else NOMINAL_SM_COUNT


class Runner:
    """Builds the launches of one (geometry, parts-per-SM): shipped spec first, then overrides."""

    def __init__(self, x: Inputs, parts_per_sm: int, sms: int):
        from tritonwarm.launchers.mla_metadata import mla_decode_metadata
        from tritonwarm.launchers.paged_attention import _head_tile

        g = x.g
        self.x = x
        group = g.heads // g.kv_heads
        self.head_tiles = -(-group // _head_tile(group))
        self.num_parts = max(1, sms * parts_per_sm // (g.kv_heads * self.head_tiles))
        self.parts_per_sm = parts_per_sm
        self.sms = sms
        self.schedule, self.num_splits = mla_decode_metadata(x.lens, g.heads, g.block_size, self.num_parts)
        max_splits = g.batch + self.num_parts
        self.partial_out = torch.empty(max_splits, g.heads, g.value_dim, dtype=torch.float32, device=x.q.device)
        self.partial_lse = torch.empty(max_splits, g.heads, dtype=torch.float32, device=x.q.device)
        self.out = torch.empty(g.batch, g.heads, g.value_dim, dtype=x.q.dtype, device=x.q.device)

    def metadata(self):
        """The shipped call's per-step metadata: whatever the declared kernel needs."""
        from tritonwarm.launchers.paged_attention import paged_decode_metadata

        x, g = self.x, self.x.g
        return paged_decode_metadata(x.lens, x.table, g.heads, g.kv_heads, g.key_dim, g.block_size)

    def spec_launch(self):
        from tritonwarm.launchers.paged_attention import paged_decode_attention_split_launch

        x = self.x
        return paged_decode_attention_split_launch(x.q, x.kv, x.table, x.lens, self.schedule, self.num_splits,
                                                   self.partial_out, self.partial_lse, x.scale, x.g.value_dim)

    def grid_splits(self, block_n: int, parts_per_sm: int | None = None) -> int:
        """Splits per request by the launcher's own rule (``grid_splits``: capped by the block table's
        capacity; this bench's table is exactly as wide as the length, so that is the length here)."""
        from tritonwarm.launchers.paged_attention import grid_splits

        g, x = self.x.g, self.x
        return grid_splits(g.batch, g.kv_heads * self.head_tiles, x.table.shape[1] * g.block_size, block_n,
                           parts_per_sm or self.parts_per_sm, self.sms)

    def _grid_launch(self, splits: int):
        """The library's grid launch spec for ``splits`` per request, partial buffers grown to fit."""
        from tritonwarm.launchers.paged_attention import paged_decode_attention_grid_split_launch

        x, g = self.x, self.x.g
        if g.batch * splits > self.partial_out.shape[0]:
            self.partial_out = torch.empty(g.batch * splits, g.heads, g.value_dim, dtype=torch.float32,
                                           device=x.q.device)
            self.partial_lse = torch.empty(g.batch * splits, g.heads, dtype=torch.float32, device=x.q.device)
        num_splits = torch.arange(0, (g.batch + 1) * splits, splits, device=x.q.device, dtype=torch.int32)
        launch = paged_decode_attention_grid_split_launch(x.q, x.kv, x.table, x.lens, splits, self.partial_out,
                                                          self.partial_lse, x.scale, g.value_dim)
        return launch, num_splits

    def split_fn(self, variant: Variant | None):
        """(split callable, combine callable) for the shipped settings (None) or a variant.

        Both split kernels launch through the library's own ``JitKernel`` and launch spec (a variant
        only overrides the spec's constexprs, warps and stages): the GPU, or Triton's interpreter
        for CPU tensors, exactly as the library launches.
        """
        from tritonwarm.jit import Launch
        from tritonwarm.launchers._attention_tiles import settings_for
        from tritonwarm.launchers.paged_attention import (
            paged_decode_attention_combine_jit,
            paged_decode_attention_combine_launch,
            paged_decode_attention_grid_split_jit,
            paged_decode_attention_split_jit,
        )

        declared = settings_for(self.x.g.key_dim)
        if (variant or declared).kernel == "grid":
            splits = self.grid_splits(variant.block_n, None) if variant else \
                self.grid_splits(declared.block_n, declared.parts_per_sm)
            launch, num_splits = self._grid_launch(splits)
            jit = paged_decode_attention_grid_split_jit
        else:
            launch, num_splits, jit = self.spec_launch(), self.num_splits, paged_decode_attention_split_jit
        if variant is not None:
            launch = Launch(grid=launch.grid, args=launch.args,
                            constexprs=dict(launch.constexprs, BLOCK_N=variant.block_n,
                                            VALUE_IS_KEY=variant.value_is_key, TABLE_AHEAD=variant.table_ahead),
                            num_warps=variant.num_warps, num_stages=variant.num_stages)
        combine = paged_decode_attention_combine_launch(self.partial_out, self.partial_lse, num_splits, self.out)
        return (lambda: jit.launch(launch)), (lambda: paged_decode_attention_combine_jit.launch(combine))


def close(out, expected) -> str | None:
    err = (out.float() - expected.float()).abs().max().item()
    return None if math.isfinite(err) and err <= 3e-2 else f"max error {err:.3g}"


def bench(fn, dev) -> float | None:
    """Median µs per call from host launches (launch gaps included where the host is slower)."""
    if dev != "cuda":
        fn()
        return None
    from triton.testing import do_bench

    return do_bench(fn, warmup=5, rep=20, return_mode="median") * 1000


def bench_gpu(fn, dev) -> float | None:
    """Median µs of ``fn`` captured once in a CUDA graph and replayed: the GPU time of its launches
    (cold L2 as ``do_bench`` flushes it; the replay's own host cost hides behind that flush), which is
    what a captured decode step sees. Host-launched figures come from ``bench``."""
    if dev != "cuda":
        fn()
        return None
    from triton.testing import do_bench

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return do_bench(graph.replay, warmup=5, rep=20, return_mode="median") * 1000


def run(dev: str, budget: float, json_path: str | None) -> None:
    from tritonwarm.launchers._attention_tiles import settings_for

    t0 = time.perf_counter()
    small = dev != "cuda"
    sms = sm_count(dev)
    result = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter, untimed)",
              "sm_count": sms, "geometries": {}, "skipped": [], "failed": []}
    if dev == "cuda":
        src = torch.empty(1 << 30, device=dev, dtype=torch.uint8)
        dst = torch.empty_like(src)
        copy_us = bench(lambda: dst.copy_(src), dev)
        result["copy_gbs"] = 2 * src.nbytes / copy_us / 1e3
        del src, dst
    copy_gbs = result.get("copy_gbs")
    rows, best_lines = [], []

    def gbs(g, us):
        return None if us is None else g.kv_bytes / us / 1e3

    for g in geometries(small):
        try:
            x = Inputs(g, dev)
        except Exception as e:  # e.g. out of memory: the geometry is skipped, the run goes on
            print(f"{g.name}: inputs failed: {_one_line(e)}")
            result["failed"].append({"geometry": g.name, "error": str(e)[:300]})
            continue
        entry = result["geometries"][g.name] = {"kv_bytes": g.kv_bytes, **asdict(g), "variants": []}
        # the shipped call, whole (host-launched and graph-replayed) and its three kernels alone
        try:
            err = close(x.shipped(), x.expected)
            if err:
                print(f"{g.name} shipped call: WRONG ({err})")
            r = Runner(x, 1, sms)
            split, combine = r.split_fn(None)
            shipped = {"host_us": bench(x.shipped, dev), "whole_us": bench_gpu(x.shipped, dev),
                       "metadata_us": bench_gpu(r.metadata, dev), "split_us": bench_gpu(split, dev),
                       "combine_us": bench_gpu(combine, dev), "wrong": err}
            shipped["gbs"] = gbs(g, shipped["whole_us"])
            entry["shipped"] = shipped
            rows.append([g.name, "shipped call, host-launched", _us(shipped["host_us"]), "", "", "",
                         _gbs(gbs(g, shipped["host_us"])), _frac(gbs(g, shipped["host_us"]), copy_gbs)])
            declared = settings_for(g.key_dim)
            shipped_label = f"shipped call ({declared.kernel}"
            if declared.kernel == "grid":
                shipped_label += f", {r.grid_splits(declared.block_n, declared.parts_per_sm)} splits/request"
            rows.append([g.name, shipped_label + "), graph (metadata+split+combine)", _us(shipped["whole_us"]),
                         _us(shipped["metadata_us"]), _us(shipped["split_us"]), _us(shipped["combine_us"]),
                         _gbs(shipped["gbs"]), _frac(shipped["gbs"], copy_gbs)])
        except Exception as e:
            print(f"{g.name} shipped call: failed: {_one_line(e)}")
            result["failed"].append({"geometry": g.name, "variant": "shipped", "error": str(e)[:300]})
        if g.kind == "gqa":
            try:
                err = close(x.sdpa(), x.expected)
                sdpa_us = bench_gpu(x.sdpa, dev)
                entry["sdpa_contiguous"] = {"us": sdpa_us, "gbs": gbs(g, sdpa_us), "wrong": err}
                rows.append([g.name, "SDPA, contiguous K/V (graph)" + (" WRONG" if err else ""), _us(sdpa_us),
                             "", "", "", _gbs(gbs(g, sdpa_us)), _frac(gbs(g, sdpa_us), copy_gbs)])
            except Exception as e:
                print(f"{g.name} SDPA: failed: {_one_line(e)}")
        runners = {p: Runner(x, p, sms) for p in PARTS_PER_SM}
        best = None
        for variant in (MLA_VARIANTS if g.kind == "mla" else GQA_VARIANTS):
            seen_splits = set()
            for p, r in runners.items():
                label = f"{variant.name} p{p}"
                if time.perf_counter() - t0 > budget:
                    result["skipped"].append(f"{g.name} {label}")
                    continue
                try:
                    if variant.kernel == "grid":
                        splits = r.grid_splits(variant.block_n)
                        if splits in seen_splits:
                            continue  # the same launch as a smaller parts-per-SM: measured already
                        seen_splits.add(splits)
                        label += f" ({splits} splits/request)"
                    split, combine = r.split_fn(variant)
                    r.partial_lse.fill_(float("nan"))  # a slot the variant forgets shows up as WRONG
                    r.out.fill_(float("nan"))
                    split()
                    combine()
                    err = close(r.out, x.expected)
                    rec = {**asdict(variant), "name": variant.name, "parts_per_sm": p, "label": label, "wrong": err}
                    if err:
                        print(f"{g.name} {label}: WRONG ({err})")
                    else:
                        rec["split_us"] = bench_gpu(split, dev)
                        rec["split_combine_us"] = bench_gpu(lambda split=split, combine=combine: (split(), combine()),
                                                            dev)
                        total = rec["split_combine_us"]
                        rec["combine_us"] = None if total is None else total - rec["split_us"]
                        rec["gbs"] = gbs(g, total)
                        if total is not None and (best is None or total < best["split_combine_us"]):
                            best = rec
                        rows.append([g.name, label, _us(total), "", _us(rec["split_us"]), _us(rec["combine_us"]),
                                     _gbs(rec["gbs"]), _frac(rec["gbs"], copy_gbs)])
                    entry["variants"].append(rec)
                except Exception as e:
                    print(f"{g.name} {label}: failed: {_one_line(e)}")
                    result["failed"].append({"geometry": g.name, "variant": label, "error": str(e)[:300]})
        if best is not None:
            entry["best"] = best
            best_lines.append(f"{g.name}: {tile_entry(g, best)}  # {_us(best['split_combine_us'])} µs, "
                              f"{_frac(best['gbs'], copy_gbs)} of copy")
        del x, runners

    result["wall_s"] = time.perf_counter() - t0
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    command = "python bench/attention_tiles.py" + (f" --json {json_path}" if json_path else "")
    if dev != "cuda":
        n = sum(len(e["variants"]) for e in result["geometries"].values())
        print(f"bench/attention_tiles.py: no GPU here, nothing timed; the shipped call and {n} variant launches "
              f"ran once in Triton's interpreter at tiny sizes; {len(result['failed'])} failed.")
        return
    from triton.runtime import driver
    from tritonwarm.launchers._attention_tiles import target_name

    print(f"\nBest setting per geometry, as launchers/paged_attention_tiles.json entries of "
          f"\"{target_name(driver.active.get_current_target())}\":")
    for line in best_lines:
        print("  " + line)
    if result["skipped"]:
        print(f"\n{len(result['skipped'])} variant launches skipped past the {budget:.0f} s budget")
    table(f"Paged decode attention on {result['device']} (device copy {copy_gbs:.0f} GB/s, {sms} SMs; "
          f"p = parts per SM; metadata excluded from variants)",
          ["geometry", "variant", "µs", "metadata µs", "split µs", "combine µs", "GB/s", "of copy"], rows, command)


def tile_entry(g: Geometry, rec: dict) -> str:
    """The best variant as an entry of launchers/paged_attention_tiles.json (one geometry class)."""
    klass = "wide" if g.key_dim > 256 else "narrow"
    fields = {k: rec[k] for k in ("kernel", "block_n", "num_warps", "num_stages", "value_is_key", "table_ahead",
                                  "parts_per_sm")}
    return f'"{klass}": {json.dumps(fields)}'


def _one_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1][:200] if text else ''}"


def _us(v):
    return "-" if v is None else f"{v:.1f}"


def _gbs(v):
    return "-" if v is None else f"{v:.0f}"


def _frac(v, copy):
    return "-" if v is None or not copy else f"{v / copy:.0%}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="PATH", help="write every measured figure here")
    p.add_argument("--budget", type=float, default=50.0,
                   help="seconds after which remaining variants are skipped (listed in the JSON)")
    args = p.parse_args()
    run("cuda" if torch.cuda.is_available() else "cpu", args.budget, args.json)


if __name__ == "__main__":
    main()
