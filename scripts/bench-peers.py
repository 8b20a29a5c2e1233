#!/usr/bin/env python3
"""scripts/bench-peers.py -- what a user would run instead of k3, timed the way scripts/bench
times k3, on the GPU machine's own Python and PyTorch:

  linear    torch.nn.functional.linear(x, w), bf16, every Kimi-K3 TP8 shape (+7168x7168),
            M = 1, 2, 4, 8, 16 (cuBLAS through PyTorch)
  attn_res  the AttnRes read written in eager PyTorch from DESIGN.md's formula (fused delta add,
            output norm; hidden 7168, 8 block slots), and torch.compile of the same function,
            T = 1, 4, 16, 256, 4096, 16384 x num_blocks = 1, 4, 8
  attn_res_triton
            a plain Triton AttnRes kernel (one program per token, an online softmax over the
            sources, the whole row of 7168 in one block), the same rows; scripts/bench
            attn_res runs this in the same command, beside k3's kernels

Timing (as scripts/bench, bench/README.md): random data (never zeros); inputs rotated over
enough copies that they exceed 200 MB (the L2 is 60 MB); '-g' figures are the median over
replays of one CUDA graph holding one call per copy, divided by the number of calls; eager
figures are CUDA events around each call (launch overhead included), median of many.

Writes one JSON file (default bench/out/peers.json) that `scripts/bench --peers FILE` reads into
its tables, and prints a short table. --dry-run runs every code path on the CPU at shrunk shapes
with modelled times (for checking the script where there is no GPU).

  python3 scripts/bench-peers.py [--out FILE] [--quick] [--only linear,attn_res,attn_res_triton]
                                 [--ts 1,16] [--nbs 1,8]
                                 [--compile-mode default|max-autotune-no-cudagraphs|none]
                                 [--compile-budget SECONDS] [--dry-run]
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time

SHAPES = [
    (1536, 7168), (3072, 7168), (2112, 7168), (2304, 1536), (4608, 1536), (3584, 7168),
    (6288, 7168), (12448, 7168), (7168, 768), (7168, 1536), (7168, 3072), (7168, 3584),
    (7168, 4224), (7168, 8448), (8448, 7168), (16896, 7168), (7168, 14336), (20480, 7168),
    (7168, 7168),
]
MS = [1, 2, 4, 8, 16]
TS = [1, 4, 16, 256, 4096, 16384]
NBS = [1, 4, 8]
H, S = 7168, 8
EPS = 1e-5
ROTATE_BYTES = 200e6
NOMINAL_BW = 4170.0  # GB/s, an H200's copy bandwidth measured 2026-11-29; --dry-run's model only

torch = None  # imported in main(), after the arguments are parsed (so --help needs no torch)


def copies_for(bytes_per_call, lo=1, hi=None):
    c = max(lo, math.ceil(ROTATE_BYTES / bytes_per_call))
    return min(c, hi) if hi else c


def attn_bytes(T, nb):
    """Bytes one AttnRes call must move (as scripts/bench): prefix and delta read, prefix
    written back, nb block rows read, out written, three [H] weights."""
    return 2 * H * (T * (4 + nb) + 3)


def progress_mode():
    """As k3.cli.progress_mode: K3_PROGRESS=0 off, 1 the live line, plain plain lines; unset, the
    live line on a terminal and plain lines (at most one per PROGRESS_INTERVAL s) in a log."""
    setting = os.environ.get("K3_PROGRESS")
    modes = {"0": "off", "1": "tty", "plain": "plain"}
    if setting in modes:
        return modes[setting]
    return "tty" if sys.stderr.isatty() else "plain"


PROGRESS_INTERVAL = 5.0
_progress = {"mode": None, "printed_at": None, "pending": None}


def progress(msg):
    p = _progress
    if p["mode"] is None:
        p["mode"] = progress_mode()
    if p["mode"] == "tty":
        sys.stderr.write("\r\x1b[K" + msg)
    elif p["mode"] == "plain":
        now = time.monotonic()
        if p["printed_at"] is None or now - p["printed_at"] >= PROGRESS_INTERVAL:
            sys.stderr.write(msg + "\n")
            p["printed_at"], p["pending"] = now, None
        else:
            p["pending"] = msg
    sys.stderr.flush()


def progress_done():
    p = _progress
    if p["mode"] == "tty":
        sys.stderr.write("\r\x1b[K")
    elif p["mode"] == "plain" and p["pending"]:
        sys.stderr.write(p["pending"] + "\n")
    p["printed_at"], p["pending"] = None, None
    sys.stderr.flush()


# ---- the peers' code --------------------------------------------------------------------------

def attn_res_torch(prefix, delta, blocks, nb, norm_w, qk_w, out_w, out, eps=EPS, out_eps=EPS):
    """DESIGN.md's AttnRes read in plain PyTorch, fp32 arithmetic, one rounding per stored value:
    p = round(prefix + delta) written back; sources = blocks[:, :nb], then p; keys RMS-normed,
    softmax over sources, values mixed in fp32, output RMS-normed with out_w."""
    p = (prefix.float() + delta.float()).to(prefix.dtype)
    prefix.copy_(p)
    v = torch.cat([blocks[:, :nb], p.unsqueeze(1)], dim=1).float()       # [T, nb+1, H]
    q = norm_w.float() * qk_w.float()                                      # [H]
    logit = (v * q).sum(-1) * torch.rsqrt(v.pow(2).mean(-1) + eps)         # [T, nb+1]
    prob = torch.softmax(logit, dim=-1)
    mixed = (prob.unsqueeze(-1) * v).sum(1)                                # [T, H]
    y = mixed * torch.rsqrt(mixed.pow(2).mean(-1, keepdim=True) + out_eps) * out_w.float()
    out.copy_(y.to(out.dtype))
    return out


_triton_kernel = None


def triton_attn_res_kernel():
    """The plain Triton AttnRes kernel, built on first use (Triton is imported only then).
    One program per token: p = round(prefix + delta) written back, then the sources blocks[t, 0],
    ..., blocks[t, nb-1], p one after another, each a full row in registers: its key logit
    (dot with norm_w * qk_w over the RMS of the row), an online softmax (running max and sum)
    and the running mix rescaled by exp(old max - new max); then the output RMSNorm."""
    global _triton_kernel
    if _triton_kernel is not None:
        return _triton_kernel
    import triton
    import triton.language as tl

    @triton.jit
    def attn_res_triton(prefix, delta, blocks, norm_w, qk_w, out_w, out, H, sbt, sbs, nb,
                        eps, out_eps, BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < H
        p = tl.load(prefix + t * H + offs, mask=mask, other=0.0).to(tl.float32)
        d = tl.load(delta + t * H + offs, mask=mask, other=0.0).to(tl.float32)
        pb = (p + d).to(prefix.dtype.element_ty)
        tl.store(prefix + t * H + offs, pb, mask=mask)
        q = tl.load(norm_w + offs, mask=mask, other=0.0).to(tl.float32) * \
            tl.load(qk_w + offs, mask=mask, other=0.0).to(tl.float32)
        m = tl.full([], -float("inf"), tl.float32)
        den = tl.full([], 0.0, tl.float32)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for s in range(0, nb + 1):
            if s < nb:
                v = tl.load(blocks + t * sbt + s * sbs + offs, mask=mask, other=0.0).to(tl.float32)
            else:
                v = pb.to(tl.float32)
            logit = tl.sum(v * q, axis=0) * tl.rsqrt(tl.sum(v * v, axis=0) / H + eps)
            m_new = tl.maximum(m, logit)
            scale = tl.exp(m - m_new)
            w = tl.exp(logit - m_new)
            acc = acc * scale + w * v
            den = den * scale + w
            m = m_new
        mixed = acc / den
        r = tl.rsqrt(tl.sum(mixed * mixed, axis=0) / H + out_eps)
        ow = tl.load(out_w + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out + t * H + offs, (mixed * r * ow).to(out.dtype.element_ty), mask=mask)

    def run(prefix, delta, blocks, nb, norm_w, qk_w, out_w, out, eps=EPS, out_eps=EPS):
        T, h = prefix.shape
        block = triton.next_power_of_2(h)
        attn_res_triton[(T,)](prefix, delta, blocks, norm_w, qk_w, out_w, out, h,
                              blocks.stride(0), blocks.stride(1), nb, eps, out_eps,
                              BLOCK=block, num_warps=16 if block >= 4096 else 4)
        return out

    _triton_kernel = run
    return run


# ---- timing -------------------------------------------------------------------------------------

class Timer:
    """Median µs per call. Real runs use CUDA events; dry runs call fn (first and last copy)
    and return the model figure."""

    def __init__(self, torch, dry, iters, warmup, graph_budget_s):
        self.torch, self.dry = torch, dry
        self.iters, self.warmup = iters, warmup
        self.graph_budget_s = graph_budget_s

    def _sync(self):
        if not self.dry:
            self.torch.cuda.synchronize()

    def eager(self, fn, iters=None, model_us=1.0):
        iters = iters or self.iters
        if self.dry:
            fn(0)
            return model_us
        torch = self.torch
        for i in range(self.warmup):
            fn(i)
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            starts[i].record()
            fn(i)
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1000.0

    def graph(self, fn, calls, iters=None, model_us=1.0):
        """fn(i) for i in range(calls) captured into one CUDA graph; median replay / calls.
        The number of replays adapts so one measurement takes about graph_budget_s."""
        iters = iters or self.iters
        if self.dry:
            fn(0)
            fn(calls - 1)
            return model_us
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(self.warmup):
                fn(i % calls)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(calls):
                fn(i)
        g.replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        one = max(time.perf_counter() - t0, 1e-6)
        n = int(max(5, min(iters, self.graph_budget_s / one)))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            starts[i].record()
            g.replay()
            ends[i].record()
        torch.cuda.synchronize()
        us = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1000.0 / calls
        del g
        return us


# ---- benchmarks -----------------------------------------------------------------------------------

class Ctx:
    def __init__(self, args, torch):
        self.args, self.torch = args, torch
        self.dry = args.dry_run
        self.device = "cpu" if self.dry else "cuda"
        self.shrink = 16 if self.dry else 1
        self.timer = Timer(torch, self.dry, 15 if args.quick else 50, 3 if args.quick else 5,
                           0.15 if args.quick else 0.3)
        self.bf16 = torch.bfloat16
        self.seed = 20261129
        self.notes = []

    def dim(self, n, lo=1, mult=1):
        if not self.dry:
            return n
        d = max(lo, n // self.shrink)
        return -(-d // mult) * mult

    def alloc_copies(self, c):
        return min(c, 3) if self.dry else c

    def randn(self, *shape):
        self.seed += 1
        g = self.torch.Generator(device=self.device)
        g.manual_seed(self.seed)
        return self.torch.randn(*shape, generator=g, device=self.device, dtype=self.bf16)

    def cleanup(self):
        import gc
        gc.collect()
        if not self.dry:
            self.torch.cuda.empty_cache()


def measure_copy(ctx):
    torch = ctx.torch
    nbytes = 2 * 1024 ** 3
    n = 1024 * 1024 if ctx.dry else nbytes // 2
    src = torch.full((n,), 1.25, device=ctx.device, dtype=ctx.bf16)
    dst = torch.full((n,), -0.5, device=ctx.device, dtype=ctx.bf16)
    us = ctx.timer.eager(lambda i: dst.copy_(src), iters=10 if ctx.args.quick else 20,
                         model_us=2 * nbytes / (NOMINAL_BW * 1e3))
    del src, dst
    ctx.cleanup()
    return {"bytes_each_way": nbytes, "us": us, "GBps": 2 * nbytes / (us * 1e3)}


def bench_linear(ctx, bw):
    torch = ctx.torch
    F = torch.nn.functional
    rows = []
    total, done = len(SHAPES) * len(MS), 0
    for si, (N, K) in enumerate(SHAPES):
        n, k = ctx.dim(N, 16, 8), ctx.dim(K, 16, 8)
        wbytes = 2 * N * K
        copies = copies_for(wbytes, 3)
        alloc = ctx.alloc_copies(copies)
        progress(f"peers linear {si + 1}/{len(SHAPES)} {N}x{K}: {copies} weight copies")
        ws = [ctx.randn(n, k) for _ in range(alloc)]
        for M in MS:
            done += 1
            progress(f"peers linear {N}x{K} M={M} ({done}/{total})")
            xs = [ctx.randn(M, k) for _ in range(alloc)]
            nbytes = 2 * (N * K + M * K + M * N)
            floor = nbytes / (bw * 1e3)

            def fn(i, xs=xs):
                c = i % alloc
                return F.linear(xs[c], ws[c])

            g_us = ctx.timer.graph(fn, alloc, model_us=floor / 0.82 + 4.0)
            e_us = None
            if M == 1:
                e_us = ctx.timer.eager(fn, iters=max(ctx.timer.iters, copies),
                                       model_us=floor / 0.82 + 9.0)
            rows.append({"N": N, "K": K, "M": M, "copies": copies, "bytes": nbytes,
                         "floor_us": floor, "graph_us": g_us, "eager_us": e_us,
                         "floor_frac": floor / g_us})
            del xs
        del ws
        ctx.cleanup()
    progress_done()
    return rows


def bench_attn_res(ctx, bw):
    torch = ctx.torch
    args = ctx.args
    rows = []
    compiled = None
    compile_state = {"spent_s": 0.0, "disabled": None}
    if args.compile_mode != "none":
        try:
            import torch._dynamo
            torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
            kw = {"dynamic": True}
            if args.compile_mode != "default":
                kw["mode"] = args.compile_mode
            compiled = torch.compile(attn_res_torch, **kw)
        except Exception as e:  # torch.compile unavailable: report, keep the eager figures
            compile_state["disabled"] = f"torch.compile unavailable: {type(e).__name__}: {e}"
    else:
        compile_state["disabled"] = "--compile-mode none"
    h = ctx.dim(H, 16, 8)
    total, done = len(TS) * len(NBS), 0
    for T in TS:
        tl = max(1, T // ctx.shrink) if ctx.dry else T
        copies = copies_for(attn_bytes(T, 1), 1, args.max_copies)
        alloc = ctx.alloc_copies(copies)
        progress(f"peers attn_res T={T}: {copies} input sets")
        sets = []
        for _ in range(alloc):
            sets.append({"prefix": ctx.randn(tl, h), "delta": ctx.randn(tl, h),
                         "blocks": ctx.randn(tl, S, h), "out": torch.empty(tl, h, device=ctx.device, dtype=ctx.bf16),
                         "norm_w": ctx.randn(h), "qk_w": ctx.randn(h), "out_w": ctx.randn(h)})
        for nb in NBS:
            done += 1
            nbytes = attn_bytes(T, nb)
            floor = nbytes / (bw * 1e3)
            row = {"T": T, "num_blocks": nb, "copies": copies, "bytes": nbytes, "floor_us": floor}

            def make(f):
                def fn(i):
                    s = sets[i % alloc]
                    f(s["prefix"], s["delta"], s["blocks"], nb, s["norm_w"], s["qk_w"], s["out_w"],
                      s["out"])
                return fn

            eager = make(attn_res_torch)
            progress(f"peers attn_res T={T} nb={nb} eager ({done}/{total})")
            row["eager_us"] = ctx.timer.eager(eager, model_us=floor * 8 + 400)
            progress(f"peers attn_res T={T} nb={nb} eager in a graph of {alloc} calls ({done}/{total})")
            row["eager_graph_us"] = ctx.timer.graph(eager, alloc, model_us=floor * 8 + 50)
            if compiled is not None and compile_state["disabled"] is None:
                if compile_state["spent_s"] > args.compile_budget:
                    compile_state["disabled"] = (f"compile budget of {args.compile_budget:.0f} s "
                                                 f"spent; later rows have no compile figures")
                else:
                    fn = make(compiled)
                    try:
                        progress(f"peers attn_res T={T} nb={nb} torch.compile: compiling ({done}/{total})")
                        t0 = time.perf_counter()
                        fn(0)
                        if not ctx.dry:
                            torch.cuda.synchronize()
                        row["compile_s"] = time.perf_counter() - t0
                        compile_state["spent_s"] += row["compile_s"]
                        progress(f"peers attn_res T={T} nb={nb} torch.compile eager ({done}/{total})")
                        row["compile_us"] = ctx.timer.eager(fn, model_us=floor * 1.4 + 30)
                        progress(f"peers attn_res T={T} nb={nb} torch.compile in a graph ({done}/{total})")
                        row["compile_graph_us"] = ctx.timer.graph(fn, alloc, model_us=floor * 1.4 + 6)
                    except Exception as e:
                        compile_state["disabled"] = f"torch.compile failed at T={T} nb={nb}: {type(e).__name__}: {str(e)[:300]}"
            for key in ("eager_us", "eager_graph_us", "compile_us", "compile_graph_us"):
                if row.get(key):
                    row[key.replace("_us", "_floor_frac")] = floor / row[key]
            rows.append(row)
        del sets
        ctx.cleanup()
    progress_done()
    if compile_state["disabled"]:
        ctx.notes.append(compile_state["disabled"])
    ctx.compile_spent_s = compile_state["spent_s"]
    return rows


def bench_attn_res_triton(ctx, bw):
    """The Triton peer at every (T, num_blocks) row: checked once against attn_res_torch on the
    first input set, then timed eager and in a graph like the other peers. Each call's delta is
    the previous call's output, as in scripts/bench attn_res."""
    torch = ctx.torch
    args = ctx.args
    rows = []
    if ctx.dry:
        kern = attn_res_torch
        ctx.notes.append("dry run: the Triton peer is stood in for by the eager PyTorch code")
    else:
        kern = triton_attn_res_kernel()
    h = ctx.dim(H, 16, 8)
    ts, nbs = ctx.ts, ctx.nbs
    total, done = len(ts) * len(nbs), 0
    for T in ts:
        tl = max(1, T // ctx.shrink) if ctx.dry else T
        copies = copies_for(attn_bytes(T, 1), 2, args.max_copies)
        alloc = ctx.alloc_copies(copies)
        progress(f"peers attn_res_triton T={T}: {copies} input sets")
        outs = [ctx.randn(tl, h) for _ in range(alloc)]
        sets = []
        for c in range(alloc):
            sets.append({"prefix": ctx.randn(tl, h), "delta": outs[c - 1], "blocks": ctx.randn(tl, S, h),
                         "out": outs[c], "norm_w": ctx.randn(h), "qk_w": ctx.randn(h) * 0.1,
                         "out_w": ctx.randn(h)})
        for nb in nbs:
            done += 1
            nbytes = attn_bytes(T, nb)
            floor = nbytes / (bw * 1e3)
            row = {"T": T, "num_blocks": nb, "copies": copies, "bytes": nbytes, "floor_us": floor}
            s0 = sets[0]
            p0 = s0["prefix"].clone()
            want = torch.empty_like(s0["out"])
            attn_res_torch(s0["prefix"], s0["delta"].clone(), s0["blocks"], nb, s0["norm_w"],
                           s0["qk_w"], s0["out_w"], want)
            s0["prefix"].copy_(p0)
            got = torch.empty_like(s0["out"])
            kern(s0["prefix"], s0["delta"].clone(), s0["blocks"], nb, s0["norm_w"], s0["qk_w"],
                 s0["out_w"], got)
            s0["prefix"].copy_(p0)
            err = ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30)).item()
            row["check_rel"] = err
            if not err <= 2e-2:
                ctx.notes.append(f"attn_res_triton T={T} nb={nb}: differs from the PyTorch code by {err:.2e}")

            def fn(i, nb=nb):
                s = sets[i % alloc]
                kern(s["prefix"], s["delta"], s["blocks"], nb, s["norm_w"], s["qk_w"], s["out_w"], s["out"])

            progress(f"peers attn_res_triton T={T} nb={nb} ({done}/{total})")
            row["eager_us"] = ctx.timer.eager(fn, iters=max(ctx.timer.iters, min(copies, 200)),
                                              model_us=floor / 0.75 + 30)
            row["graph_us"] = ctx.timer.graph(fn, alloc, model_us=floor / 0.75 + 4 + 0.7 * nb)
            row["floor_frac"] = floor / row["graph_us"]
            rows.append(row)
        del sets, outs
        ctx.cleanup()
    progress_done()
    return rows


def finite(v):
    """JSON has no NaN or infinity: such values become null (scripts/bench shows '-')."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [finite(x) for x in v]
    return v


def fmt(v, w=9):
    if v is None:
        return "-".rjust(w)
    if v >= 1000:
        return f"{v:.0f}".rjust(w)
    if v >= 100:
        return f"{v:.1f}".rjust(w)
    return f"{v:.2f}".rjust(w)


def print_tables(doc):
    print(f"bench-peers.py {doc['date']} on {doc['device']}, torch {doc['torch']}"
          + (" -- DRY RUN: modelled times, not measurements" if doc["dry_run"] else ""))
    print(f"copy bandwidth {doc['copy_GBps']:.0f} GB/s (2 GiB device-to-device copy_, read + written)")
    if doc.get("linear"):
        print("\nlinear: torch.nn.functional.linear, bf16, µs per call in a CUDA graph (eager at M = 1)")
        print(f"{'N x K':>12} " + " ".join(f"{'M=' + str(m):>9}" for m in MS) + f" {'eager M=1':>9} {'floor M=1':>9}")
        by = {}
        for r in doc["linear"]:
            by.setdefault((r["N"], r["K"]), {})[r["M"]] = r
        for (N, K), d in by.items():
            line = f"{str(N) + 'x' + str(K):>12} " + " ".join(fmt(d.get(m, {}).get("graph_us")) for m in MS)
            line += " " + fmt(d.get(1, {}).get("eager_us")) + " " + fmt(d.get(1, {}).get("floor_us"))
            print(line)
    if doc.get("attn_res"):
        print(f"\nattn_res: eager PyTorch and torch.compile ({doc['compile_mode']}), µs per call; -g: in a CUDA graph")
        print(f"{'T':>6} {'nb':>3} {'eager':>9} {'eager-g':>9} {'compile':>9} {'compile-g':>9} {'floor':>9}")
        for r in doc["attn_res"]:
            print(f"{r['T']:>6} {r['num_blocks']:>3} " + " ".join(fmt(r.get(k)) for k in
                  ("eager_us", "eager_graph_us", "compile_us", "compile_graph_us", "floor_us")))
    if doc.get("attn_res_triton"):
        print("\nattn_res_triton: the plain Triton kernel, µs per call; -g: in a CUDA graph")
        print(f"{'T':>6} {'nb':>3} {'triton':>9} {'triton-g':>9} {'floor':>9} {'check':>9}")
        for r in doc["attn_res_triton"]:
            print(f"{r['T']:>6} {r['num_blocks']:>3} " + " ".join(fmt(r.get(k)) for k in
                  ("eager_us", "graph_us", "floor_us")) + f" {r.get('check_rel', float('nan')):>9.1e}")
    for n in doc.get("notes", []):
        print("note: " + n)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/out/peers.json", help="JSON file to write")
    ap.add_argument("--quick", action="store_true", help="fewer samples")
    ap.add_argument("--dry-run", action="store_true", help="CPU, shrunk shapes, modelled times")
    ap.add_argument("--only", default="linear,attn_res,attn_res_triton",
                    help="comma list: linear, attn_res, attn_res_triton")
    ap.add_argument("--ts", default=None, help="attn_res rows: only these token counts (comma list)")
    ap.add_argument("--nbs", default=None, help="attn_res rows: only these num_blocks (comma list)")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile mode: default, max-autotune-no-cudagraphs, none (skip)")
    ap.add_argument("--compile-budget", type=float, default=100.0,
                    help="seconds of compilation after which compile figures stop (default 100)")
    ap.add_argument("--max-copies", type=int, default=1024,
                    help="most rotated input sets in one attn_res graph (default 1024)")
    ap.add_argument("--bw", type=float, default=None, help="floors at this GB/s instead of the measured one")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    for s in only:
        if s not in ("linear", "attn_res", "attn_res_triton"):
            ap.error(f"--only: unknown benchmark '{s}'")

    global torch
    try:
        import torch as torch_module
    except ImportError as e:
        sys.exit(f"bench-peers: PyTorch is not importable here ({e}); run it with the GPU machine's python3")
    torch = torch_module
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("bench-peers: CUDA is not available to PyTorch; use --dry-run to check the script")
    ctx = Ctx(args, torch)
    try:
        ctx.ts = [int(x) for x in args.ts.split(",")] if args.ts else TS
        ctx.nbs = [int(x) for x in args.nbs.split(",")] if args.nbs else NBS
    except ValueError:
        ap.error("--ts and --nbs take comma lists of integers")
    t_start = time.perf_counter()
    progress("peers: copy bandwidth (2 GiB device-to-device)")
    copy = measure_copy(ctx)
    bw = args.bw or copy["GBps"]
    doc = {
        "tool": "scripts/bench-peers.py",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": "cpu (dry run)" if ctx.dry else torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": getattr(torch.version, "cuda", None),
        "python": platform.python_version(),
        "dry_run": ctx.dry,
        "quick": args.quick,
        "copy": copy,
        "copy_GBps": copy["GBps"],
        "floor_GBps": bw,
        "compile_mode": args.compile_mode,
        "rotate_bytes": ROTATE_BYTES,
        "method": ("median µs per call; graph: one CUDA graph of one call per rotated input copy "
                   "(copies x bytes > 200 MB, attn_res at most --max-copies sets), replays timed with "
                   "CUDA events, divided by calls; eager: events around each call; random bf16 data"),
        "notes": ctx.notes,
        "linear": [],
        "attn_res": [],
        "attn_res_triton": [],
    }
    if ctx.dry:
        ctx.notes.append("dry run: every time is a model, not a measurement")
    if "linear" in only:
        doc["linear"] = bench_linear(ctx, bw)
    if "attn_res" in only:
        doc["attn_res"] = bench_attn_res(ctx, bw)
        doc["compile_s"] = getattr(ctx, "compile_spent_s", 0.0)
    if "attn_res_triton" in only:
        doc["attn_res_triton"] = bench_attn_res_triton(ctx, bw)
    doc["wall_s"] = time.perf_counter() - t_start
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(finite(doc), f, indent=1, sort_keys=True, allow_nan=False)
        f.write("\n")
    print_tables(doc)
    print(f"\nwrote {args.out} ({doc['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
