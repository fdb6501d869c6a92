"""A whole model on the GPU: BERT-base in float16 offloaded to cuda_mma, against PyTorch.

For each batch (seq 128), in separate processes (each engine in its own):

* **tirbyoc**: `tirbyoc.run_model` on ``bert_base_fp16`` (the built-in BERT-base, half
  precision, each matmul summed in float32 and rounded once, as PyTorch computes
  ``model.half()``): every matmul offloaded to cuda_mma (the tensor-core kernel), the rest of
  the model on TVM's default GPU pipeline (dlight's schedules); each offloaded function
  verified against TVM's build of it, the whole model's output against TVM's build of the
  untouched model on the GPU (dlight), both timed, both with the launches captured as a CUDA
  graph (tirbyoc's default for CUDA; ``--no-cuda-graph`` builds both without). Unless
  ``--no-profile``, each offloaded function is also timed alone against dlight's schedule of
  it, and the functions left to TVM alone too (`rest_times`, unfused), so the table names
  where the rest of the time goes.
* **torch**: the same network written in PyTorch (`torch_model`: the same layers, shapes and
  float16 weights; its own random values), ``model.half()`` on the GPU, timed eager and
  under ``torch.compile`` (the compile time reported beside it; ``--no-compile`` skips it).

Rounds: the eager timing runs before and after tirbyoc's, so its spread shows the GPU's own
drift. Writes JSON after each batch. Needs a CUDA GPU, TVM with CUDA, and torch for the peer.

    python bench/gpu_models.py --batches 1,8 --out bench/results/gpu_models_h100.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HIDDEN, HEADS, FFN, LAYERS, SEQ = 768, 12, 3072, 12, 128


def progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- tirbyoc
def model_file(batch: int, layers: int, folder: Path) -> Path:
    """A model file holding the built-in BERT-base fp16 at ``batch`` (the built-in is batch 1)."""
    path = folder / f"bert_fp16_b{batch}.py"
    path.write_text("from tirbyoc.app.models import bert_base_fp16\n"
                    f"bert = bert_base_fp16(batch={batch}, seq={SEQ}, layers={layers})\n")
    return path


def rest_times(result, mod_path: Path, target, repeat: int) -> dict:
    """Milliseconds per call of each function no template took, alone on the GPU as TVM's
    default pipeline schedules it (times its number of calls in the model)."""
    from tvm import relax

    from tirbyoc.app.frontends import load_model
    from tirbyoc.app.profiling import time_function

    _, loaded = load_model(str(mod_path), ["cuda_mma"], None, None)
    mod = relax.transform.LegalizeOps()(loaded)
    out = {}
    for f in result.report.functions:
        if f.offloaded:
            continue
        try:
            out[f.name] = {"ms": round(time_function(mod[f.name], target, repeat), 4), "calls": f.calls}
        except Exception as err:  # noqa: BLE001 - one function failing to time is a finding
            out[f.name] = {"error": str(err)[-200:]}
    return out


def run_tirbyoc(batch: int, layers: int, repeat: int, profile: bool = True, cuda_graph: bool = True) -> dict:
    """tirbyoc's row. ``cuda_graph``: both builds with TVM's CUDA graph rewrite (the model's
    kernel launches captured once and replayed: `relax.backend.use_cuda_graph`, tirbyoc's
    default for CUDA builds); False turns it off."""
    import tvm

    import tirbyoc
    from tirbyoc import run_model

    config = {"relax.backend.use_cuda_graph": cuda_graph}
    with tempfile.TemporaryDirectory() as tmp, tvm.transform.PassContext(opt_level=tvm.transform.PassContext.current().opt_level, config=config):
        path = model_file(batch, layers, Path(tmp))
        t0 = time.time()
        result = run_model(str(path), ["cuda_mma"], repeat=repeat, profile=profile)
        row = result.to_json()
        row["cuda_graph"] = cuda_graph
        row["wall_s"] = round(time.time() - t0, 1)
        if profile:
            row["rest_ms"] = rest_times(result, path, tirbyoc.get_template("cuda_mma").tvm_target(), repeat)
    return row


# ---------------------------------------------------------------------------- torch
def torch_model(layers: int):
    import torch
    import torch.nn.functional as F

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.proj = torch.nn.Linear(HIDDEN, 3 * HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN)
            self.up, self.down = torch.nn.Linear(HIDDEN, FFN), torch.nn.Linear(FFN, HIDDEN)
            self.ln1, self.ln2 = torch.nn.LayerNorm(HIDDEN), torch.nn.LayerNorm(HIDDEN)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, HEADS, HIDDEN // HEADS).unbind(2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            scores = q @ k.transpose(-1, -2) / (HIDDEN // HEADS) ** 0.5
            ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, HIDDEN)
            x = self.ln1(x + self.proj(ctx))
            return self.ln2(x + self.down(F.gelu(self.up(x))))

    return torch.nn.Sequential(*[Layer() for _ in range(layers)])


def time_torch_call(call, repeat: int) -> float:
    """Milliseconds per call (best of 5 windows of ``repeat`` calls, CUDA events)."""
    import torch

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            call()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / repeat)
    return best


def run_torch(batch: int, layers: int, repeat: int, compile_too: bool) -> dict:
    import torch

    torch.manual_seed(0)
    model = torch_model(layers).half().cuda().eval()
    x = torch.randn(batch, SEQ, HIDDEN, dtype=torch.float16, device="cuda")
    row = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    with torch.inference_mode():
        row["eager_ms"] = round(time_torch_call(lambda: model(x), repeat), 4)
        if compile_too:
            t0 = time.time()
            compiled = torch.compile(model)
            try:
                compiled(x)
                row["compile_s"] = round(time.time() - t0, 1)
                row["compiled_ms"] = round(time_torch_call(lambda: compiled(x), repeat), 4)
            except Exception as err:  # noqa: BLE001 - no compiler on the machine is a finding
                row["compiled_error"] = f"{type(err).__name__}: {str(err)[-300:]}"
    return row


# ---------------------------------------------------------------------------- driver
def engine(args) -> int:
    if args.engine == "tirbyoc":
        row = run_tirbyoc(args.batch, args.layers, args.repeat, not args.no_profile, not args.no_cuda_graph)
    else:
        row = run_torch(args.batch, args.layers, args.repeat, not args.no_compile)
    print("JSON " + json.dumps(row, default=str))
    return 0


def in_process(args, which: str, batch: int, timeout: int, extra=()) -> dict:
    """One engine's row from its own process (or why there is none)."""
    cmd = [sys.executable, __file__, "--engine", which, "--batch", str(batch), "--layers", str(args.layers),
           "--repeat", str(args.repeat), *extra]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = [l for l in done.stdout.splitlines() if l.startswith("JSON ")]
    if done.returncode or not lines:
        return {"error": f"exit {done.returncode}: {(done.stderr or done.stdout)[-1500:]}"}
    return json.loads(lines[-1][5:])


def summary(row: dict) -> dict:
    """The headline of one batch: milliseconds per engine and the ratios."""
    tb, to = row.get("tirbyoc", {}), row.get("torch", [])
    ms = (tb.get("latency_ms") or {}).get("offloaded")
    eager = [t["eager_ms"] for t in to if "eager_ms" in t]
    compiled = [t["compiled_ms"] for t in to if "compiled_ms" in t]
    out = {"tirbyoc_ms": ms, "tvm_dlight_ms": (tb.get("latency_ms") or {}).get("baseline"),
           "verified": tb.get("verified"), "coverage": tb.get("coverage"),
           "torch_eager_ms": eager, "torch_compile_ms": compiled}
    if ms and eager:
        out["x_torch_eager"] = [round(e / ms, 3) for e in eager]
    if ms and compiled:
        out["x_torch_compile"] = round(min(compiled) / ms, 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=("tirbyoc", "torch"), help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--no-profile", action="store_true", help="skip timing each function alone")
    ap.add_argument("--no-cuda-graph", action="store_true",
                    help="build both TVM models without the CUDA graph rewrite (tirbyoc's default has it)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per engine process")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "gpu_models.json"))
    args = ap.parse_args(argv)
    if args.engine:
        return engine(args)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        graph = "" if args.no_cuda_graph else ", CUDA graph"
        row = {"model": f"BERT-base fp16, {args.layers} layers, batch {batch}, seq {SEQ}{graph}"}
        progress(f"{row['model']}: torch (eager{'' if args.no_compile else ' and torch.compile'})")
        first = in_process(args, "torch", batch, args.timeout, ["--no-compile"] if args.no_compile else [])
        progress(f"{row['model']}: tirbyoc (offload, verify, build, time)")
        row["tirbyoc"] = in_process(args, "tirbyoc", batch, args.timeout,
                                    [*(["--no-profile"] if args.no_profile else []),
                                     *(["--no-cuda-graph"] if args.no_cuda_graph else [])])
        progress(f"{row['model']}: torch eager again")
        row["torch"] = [first, in_process(args, "torch", batch, args.timeout, ["--no-compile"])]
        row["summary"] = summary(row)
        progress(json.dumps(row["summary"]))
        rows.append(row)
        Path(args.out).write_text(json.dumps({"rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
