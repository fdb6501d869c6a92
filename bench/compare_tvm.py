"""tirbyoc's matcher next to TVM's own checks on the same workloads (table + JSON).

Columns: TVM's exact ``tensorize`` on the loop nest as written, TVM's
``get_tensorize_loop_mapping`` (padding allowed), TVM's ``get_auto_tensorize_mapping_info``,
tirbyoc's match, whether tirbyoc reads every operand in place (else what it stages), and
whether the iterator TVM picks for each intrinsic axis is one tirbyoc picks too.
Where TVM maps but tirbyoc stages a transpose or a pack, TVM's tensorize would hand the
implementation a window it cannot read in place.
"""

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import tirbyoc  # noqa: E402
from tirbyoc.matching.compare import compare  # noqa: E402
from tirbyoc.offloading.table import render  # noqa: E402
from tirbyoc.testing.workloads import conv2d, matmul  # noqa: E402


def cases():
    blas = tirbyoc.get_template("blas").intrinsic("sgemm_64x64x64_nn")
    vnni = tirbyoc.get_template("x86_vnni").intrinsic("dot_16x4_u8i8i32")
    u8 = ("uint8", "int8", "int32")
    return [
        ("matmul 64^3 exact", matmul(64, 64, 64), "C", blas),
        ("matmul, loops k,j,i", matmul(64, 64, 64, order="kji"), "C", blas),
        ("matmul, B*A", matmul(64, 64, 64, swap_mul=True), "C", blas),
        ("matmul 17x63x65", matmul(17, 63, 65), "C", blas),
        ("matmul, A transposed", matmul(64, 64, 64, trans_a=True), "C", blas),
        ("batched matmul", matmul(64, 64, 64, batch=2), "C", blas),
        ("matmul, init outside", matmul(64, 64, 64, init="outside"), "C", blas),
        ("conv2d NCHW 3x3", conv2d(1, 32, 16, 16, 64, 3, 3), "conv", blas),
        ("conv2d NHWC 3x3", conv2d(1, 32, 16, 16, 64, 3, 3, layout="NHWC"), "conv", blas),
        ("conv2d NHWC s2 d2", conv2d(1, 32, 17, 17, 64, 3, 3, layout="NHWC", stride=2, dilation=2), "conv", blas),
        ("int8 dense, W[N,K]", matmul(64, 64, 64, *u8, trans_b=True), "C", vnni),
        ("int8 dense, K=4", matmul(16, 16, 4, *u8, trans_b=True), "C", vnni),
        ("int8 GEMV (M=1)", matmul(1, 64, 64, *u8, trans_b=True), "C", vnni),
        ("int8 matmul, W[K,N]", matmul(64, 64, 64, *u8), "C", vnni),
        ("int8 dense, loops k,j,i", matmul(64, 64, 64, *u8, trans_b=True, order="kji"), "C", vnni),
        ("int8 conv NHWC", conv2d(1, 32, 8, 8, 64, 3, 3, layout="NHWC", dtype="uint8", wdtype="int8", acc="int32"), "conv", vnni),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write JSON here")
    args = parser.parse_args()
    rows = []
    for name, func, block, intrin in cases():
        rows.append({"workload": name, **asdict(compare(func, block, intrin))})
    yn = lambda b: "yes" if b else "no"  # noqa: E731
    print(render(
        ["workload", "intrinsic", "TVM exact", "TVM loop map", "TVM auto", "tirbyoc", "in place / staged", "same iters"],
        [[r["workload"], r["intrinsic"].split(".")[1], yn(r["tvm_exact"]), yn(r["tvm_loop_mapping"]),
          yn(r["tvm_auto"]), yn(r["tirbyoc"]), "in place" if r["tirbyoc_direct"] else (r["staging"] or r["reason"]),
          "-" if r["agree"] is None else yn(r["agree"])] for r in rows]))
    summary = {k: sum(1 for r in rows if r[k]) for k in ("tvm_exact", "tvm_loop_mapping", "tvm_auto", "tirbyoc")}
    print("\nmatched:", ", ".join(f"{k} {v}/{len(rows)}" for k, v in summary.items()))
    if args.out:
        Path(args.out).write_text(json.dumps({"cases": rows, "matched": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
