"""The measurements of `bench/gemm.py`, each run in a process of its own (`gemm.spawn`), and
the report of their results. Imported only inside a worker process or after all of them ran,
so that TVM's and OpenBLAS's pools are sized by the environment the process started with."""

from __future__ import annotations

import ctypes
import glob
import statistics
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

import tirbyoc
from tirbyoc import ExternLibrary
from tirbyoc._tvm import to_tensor, tvm
from tirbyoc.ir.domains import random_array
from tirbyoc.offloading.table import render
from tirbyoc.offloading.verification import compile_func
from tirbyoc.relax.prepack import packed_function, packing_function, weight_copies
from tirbyoc.testing.workloads import conv2d, matmul

HERE = Path(__file__).resolve().parent


# The int8 templates this benchmark times, best first, each beside the peak of its own
# instruction: (C source in csrc/, symbol, what it times). A symbol returns the MACs it did.
PMADDWD_YMM = ("pmaddwd_peak.c", "tirbyoc_pmaddwd_ymm_peak", "7 independent vpmaddwd + vpaddd ymm")
INT8_PEAKS = {
    "x86_amx": ("amx_peak.c", "tirbyoc_amx_peak", "4 independent tdpbusd tile chains (2x2 16x16x64)"),
    "x86_vnni": ("vnni_peak.c", "tirbyoc_vnni_peak", "24 independent vpdpbusd zmm"),
    "x86_avx512bw": ("pmaddwd_peak.c", "tirbyoc_pmaddwd_zmm_peak", "14 independent vpmaddwd + vpaddd zmm"),
    "x86_avx2_gemm": PMADDWD_YMM,  # the kernel call and the intrinsic: the same instruction
    "x86_avx2": PMADDWD_YMM,
}


# The fp32 templates, each beside the peak of its fused multiply-add.
FP32_PEAKS = {
    "x86_fp32_avx512": ("fma_peak.c", "tirbyoc_fma_zmm_peak", "12 independent vfmadd231ps zmm chains"),
    "x86_fp32_avx2": ("fma_peak.c", "tirbyoc_fma_ymm_peak", "12 independent vfmadd231ps ymm chains"),
}
PEAKS = INT8_PEAKS | FP32_PEAKS


def templates_here(names=INT8_PEAKS) -> tuple[list[str], dict[str, str]]:
    """(the templates of ``names`` (default `INT8_PEAKS`) this CPU runs, why each other one
    does not)."""
    runs, why_not = [], {}
    for name in names:
        tmpl = tirbyoc.get_template(name)
        if tmpl.runs_here():
            runs.append(name)
        else:
            why_not[name] = tmpl.unavailable_reason()
    return runs, why_not


def template_target(name: str):
    """The target ``name`` is timed for: its own declared CPU (x86_vnni cascadelake,
    x86_avx512bw skylake-avx512, x86_avx2 haswell), so that each row runs that template's
    instructions only - built for this CPU, LLVM would turn x86_avx2's vpmaddwd + vpaddd into
    AVX-512 VNNI's vpdpwssd where this CPU has it."""
    from tirbyoc.app.run_target import complete_target

    return complete_target(dict(tirbyoc.get_template(name).target))


def time_tvm(executable, args, number: int, repeat: int) -> float:
    """Median seconds per call (TVM's own timer: warm-up, then `repeat` x `number` calls)."""
    timer = executable.mod.time_evaluator("main", tvm.cpu(), number=number, repeat=repeat)
    return statistics.median(timer(*args).results)


def time_py(fn, number: int, repeat: int) -> float:
    fn()
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t) / number)
    return statistics.median(runs)


def peak(threads: int, template: str = "x86_vnni", seconds: float = 0.25, reps: int = 5, **_) -> dict:
    """The peak of ``template``'s instruction on this CPU at 1 .. ``threads`` threads
    (`PEAKS`: independent chains in inline assembly, one thread per core), best of
    ``reps`` repetitions (and every sample)."""
    source, symbol, _ = PEAKS[template]
    lib = ExternLibrary(f"tirbyoc_{source[:-2]}", [HERE / "csrc" / source], [symbol])
    fn = getattr(lib.load(), symbol)
    fn.restype, fn.argtypes = ctypes.c_int64, [ctypes.c_int64]
    start = time.perf_counter()
    per_iter = fn(100_000) / 100_000  # also the warm-up
    iters = int(seconds / (time.perf_counter() - start) * 100_000)
    macs = iters * per_iter
    best, samples = {}, {}
    for t in range(1, threads + 1):
        for _ in range(reps):
            workers = [threading.Thread(target=fn, args=(iters,)) for _ in range(t)]
            start = time.perf_counter()
            for th in workers:
                th.start()
            for th in workers:
                th.join()
            gops = t * macs * 2 / (time.perf_counter() - start) / 1e9
            samples.setdefault(str(t), []).append(round(gops, 1))
        best[str(t)] = max(samples[str(t)])
    return {"best": best, "samples": samples}


PEAK_NOISE = 0.02  # two timings of the same peak differ by this much on a quiet machine


def fraction_of_peak(gops: float, peak_gops: float, what: str, threads: int) -> float:
    """``gops`` as a fraction of the peak measured in the run; more than `PEAK_NOISE` above 1
    the peak was measured while the machine was busy, and the run stops saying so
    (bench/gemm.py once printed kernels at 1.7x "of peak"); a kernel at the peak reads 1.00."""
    frac = gops / peak_gops
    if frac > 1.0 + PEAK_NOISE:
        raise SystemExit(f"{what}: {gops:.0f} GOPS is {frac:.2f} of the {threads}-thread peak measured "
                         f"({peak_gops:.0f} GOPS): the peak was taken while the machine was busy. "
                         "Rerun on a quiet machine.")
    return frac


def int8_cases(quick: bool) -> list:
    """(name, PrimFunc, MACs, with TVM's default build beside it) for each int8 row."""
    from gemm import RESNET_CONVS  # deferred: gemm imports this module inside its workers

    size = 512 if quick else 1024
    cases = [(f"GEMM {size}^3 (B [N,K])", matmul(size, size, size, "uint8", "int8", "int32", trans_b=True),
              size ** 3, True)]
    for name, hw, c, oc, kernel, stride in RESNET_CONVS[:2] if quick else RESNET_CONVS:
        func = conv2d(1, c, hw + kernel - 1, hw + kernel - 1, oc, kernel, kernel, layout="NHWC",
                      stride=stride, dtype="uint8", wdtype="int8", acc="int32")
        cases.append((f"conv {name} {hw}x{hw}x{c}->{oc}", func, hw * hw * c * oc * kernel * kernel, False))
    return cases


# BERT-base's matmuls at sequence length 128 (batch 1): (name, M, N, K)
BERT_MATMULS = [("BERT QKV / output 128x768x768", 128, 768, 768),
                ("BERT FFN1 128x3072x768", 128, 3072, 768),
                ("BERT FFN2 128x768x3072", 128, 768, 3072)]


def fp32_cases(quick: bool) -> list:
    """(name, PrimFunc, MACs, numpy's (M, N, K) or None) for each fp32 row: BERT's matmuls
    (B [K, N], as ONNX's MatMul) and ResNet-50's convolutions, NHWC."""
    from gemm import RESNET_CONVS  # deferred: gemm imports this module inside its workers

    cases = [(name, matmul(m, n, k), m * n * k, (m, n, k)) for name, m, n, k in BERT_MATMULS[:1 if quick else 3]]
    for name, hw, c, oc, kernel, stride in RESNET_CONVS[:2] if quick else RESNET_CONVS:
        func = conv2d(1, c, hw + kernel - 1, hw + kernel - 1, oc, kernel, kernel, layout="NHWC", stride=stride)
        cases.append((f"conv {name} {hw}x{hw}x{c}->{oc}", func, hw * hw * c * oc * kernel * kernel, None))
    return cases


def _kernel_case(precision: str, case: int, quick: bool):
    if precision == "fp32":
        name, func, macs, shape = fp32_cases(quick)[case]
        # the weight is a constant, as in a model: TVM's mark lets the schedule stage it in
        # the layout its core reads best, a copy the deployed model runs once
        return name, func.with_attr("layout_free_buffers", [1]), macs, False
    return int8_cases(quick)[case]


def kernel(threads: int, case: int, template: str = "x86_vnni", quick: bool = False, precision: str = "int8",
         **_) -> dict:
    """One row of an int8 (or, ``precision="fp32"``, fp32) template: the offloaded function with
    its weight (parameter 1) packed once, as a deployed model runs it, and packed on every
    call; both outputs must agree."""
    name, func, macs, baseline = _kernel_case(precision, case, quick)
    target = template_target(template)
    # the core against its peak: a 3x3 convolution's 9-tap sum, not Winograd's fewer products
    # (bench/winograd.py times that form against this one)
    off = tirbyoc.offload(func, replace(tirbyoc.get_template(template), winograd=0), target=target)
    row = {"workload": name, "template": template, "target": target, "threads": threads, "macs": macs,
           "offloaded": bool(off.offloaded)}
    if not off.offloaded:
        return {**row, "reason": off.blocks[0].reason}
    rng = np.random.default_rng(0)
    arrays = [random_array([int(x) for x in b.shape], str(b.dtype), rng) for b in func.params]
    args = [to_tensor(a) for a in arrays]
    number = max(1, int(2e8 / macs))
    per_call = compile_func(off.func, target, "offloaded")
    row |= {"verified": bool(off.verification),
            "per_call_gops": 2 * macs / time_tvm(per_call, args, number, 7) / 1e9}
    copies = weight_copies(off.func, {1})
    if copies:
        packer = compile_func(packing_function(off.func, copies[0]), target, "weight packing")
        packed_w = to_tensor(np.zeros([int(d) for d in copies[0].packed.shape], str(copies[0].packed.dtype)))
        packer.mod["main"](args[1], packed_w)
        packed = compile_func(packed_function(off.func, copies), target, "packed")
        out = to_tensor(np.zeros_like(arrays[2]))
        packed_args = [args[0], packed_w, out]
        packed.mod["main"](*packed_args)
        per_call.mod["main"](*args)
        row["packed_same_as_per_call"] = bool(np.array_equal(out.numpy(), args[2].numpy()))
        row["packed_gops"] = 2 * macs / time_tvm(packed, packed_args, number, 7) / 1e9
    else:
        row["packed_gops"] = row["per_call_gops"]  # nothing to pack: the weight is read in place
    if baseline:
        row["tvm_default_gops"] = 2 * macs / time_tvm(compile_func(func, target, "untouched"), args, 1, 3) / 1e9
    return row


def torch_int_mm(threads: int, quick: bool = False, **_) -> dict:
    try:
        import torch
    except ImportError:
        return {"gops": None}
    torch.set_num_threads(threads)
    n = 512 if quick else 1024
    a = torch.randint(-128, 127, (n, n), dtype=torch.int8)
    b = torch.randint(-128, 127, (n, n), dtype=torch.int8)
    return {"gops": 2 * n ** 3 / time_py(lambda: torch._int_mm(a, b), number=5, repeat=5) / 1e9}


def openblas_kernel(pattern: str, symbol: str) -> str | None:
    """The OpenBLAS build and core kernel of the library matching ``pattern`` (a glob under
    site-packages), read from the library itself."""
    site = Path(np.__file__).resolve().parents[1]
    for path in glob.glob(str(site / pattern)):
        try:
            fn = getattr(ctypes.CDLL(path), symbol)
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_char_p
        return fn().decode()
    return None


def blas(threads: int, n: int, **_) -> dict:
    func = matmul(n, n, n, trans_b=False)
    off = tirbyoc.offload(func, "blas")
    exe = compile_func(off.func, tirbyoc.get_template("blas").target, "offloaded")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    args = [to_tensor(a), to_tensor(b), to_tensor(np.zeros((n, n), np.float32))]
    sec = time_tvm(exe, args, max(1, int(5e7 / n ** 3)), 7)
    return {"verified": bool(off.verification), "tirbyoc_gflops": 2 * n ** 3 / sec / 1e9, "tirbyoc_us": sec * 1e6,
            "tirbyoc_openblas": openblas_kernel("scipy_openblas32/lib/libscipy_openblas*.so", "scipy_openblas_get_config")}


def numpy_matmul(threads: int, n: int, case: int | None = None, quick: bool = False, **_) -> dict:
    """numpy's matmul (OpenBLAS) of n x n x n, or of fp32 row ``case``'s (M, N, K)."""
    m, n, k = fp32_cases(quick)[case][3] if case is not None else (n, n, n)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    sec = time_py(lambda: a @ b, max(1, int(5e7 / (m * n * k))), 7)
    return {"numpy_gflops": 2 * m * n * k / sec / 1e9, "numpy_us": sec * 1e6,
            "numpy_openblas": openblas_kernel("numpy.libs/libscipy_openblas*.so", "scipy_openblas_get_config64_")}


WORKERS = {"peak": peak, "kernel": kernel, "torch": torch_int_mm, "blas": blas, "numpy": numpy_matmul}


def _kernel_table(template: str, part: dict, fp32: bool) -> list[str]:
    unit = "GFLOP/s" if fp32 else "GOPS"
    lines = [f"{template} peak ({part['peak']}, best of the samples before and after the kernels): "
             + ", ".join(f"{t} thread(s) {g:.0f} {unit}" for t, g in part["peak_gops"].items())]
    refused = [(r["workload"], str(r["threads"]), "not offloaded: " + (r.get("reason") or "")[-70:], "", "", "",
                "", "", "-") for r in part["rows"] if not r.get("offloaded", True)]
    rows = [(r["workload"], str(r["threads"]), f"{r.get('packed_gops', 0):.0f}", f"{r.get('packed_of_peak', 0):.2f}",
             f"{r.get('per_call_gops', 0):.0f}", f"{r.get('per_call_of_peak', 0):.2f}",
             *((f"{r['numpy_gops']:.0f}" if r.get("numpy_gops") else "-",
                f"{r['packed_gops'] / r['numpy_gops']:.2f}" if r.get("numpy_gops") else "-") if fp32 else
               (f"{r['tvm_default_gops']:.1f}" if "tvm_default_gops" in r else "-",
                f"{r['torch_int_mm_gops']:.0f}" if r.get("torch_int_mm_gops") else "-")),
             "yes" if r.get("verified") and r.get("packed_same_as_per_call", True) else "NO")
            for r in part["rows"] if r.get("offloaded", True)] + refused
    extra = ["numpy matmul", "vs numpy"] if fp32 else ["TVM default", "torch._int_mm"]
    return lines + ["", render([f"{template} workload", "threads", f"{unit} (weight packed once)", "of peak",
                                f"{unit} (packed per call)", "of peak", *extra, "verified"], rows), ""]


def report(result: dict) -> str:
    """The tables a person reads: each int8 and fp32 template's rows against its peak, blas
    rows against numpy."""
    lines = []
    for precision in ("int8", "fp32"):
        for template, part in result.get(precision, {}).items():
            lines += _kernel_table(template, part, precision == "fp32")
    for template, why in result["skipped"].items():
        lines.append(f"{template} skipped: {why}")
    if result["blas"]:
        lines.append(render(["blas n", "threads", "GFLOP/s", "numpy GFLOP/s", "ratio", "verified"],
                            [(b["n"], b["threads"], f"{b['tirbyoc_gflops']:.1f}", f"{b['numpy_gflops']:.1f}",
                              f"{b['ratio_vs_numpy']:.2f}", "yes" if b["verified"] else "NO") for b in result["blas"]]))
    tiny = result["blas_tiny_call"]
    if tiny:
        lines.append(f"\nblas 2x2x2 call: {tiny['tirbyoc_us']:.2f} us (numpy matmul {tiny['numpy_us']:.2f} us)")
    kernels = {b.get("tirbyoc_openblas") for b in result["blas"]} | {b.get("numpy_openblas") for b in result["blas"]}
    kernels |= {r.get("numpy_openblas") for part in result.get("fp32", {}).values() for r in part["rows"]}
    lines.append("OpenBLAS: " + "; ".join(sorted(k for k in kernels if k)))
    return "\n".join(lines)
