"""A whole model on the GPU: BERT-base and ResNet-50 in float16 offloaded to cuda_mma, against PyTorch.

For each model (``--models bert,resnet50``) and batch (BERT at seq 128; ResNet-50 at 224x224),
in separate processes (each engine in its own):

* **tirbyoc**: `tirbyoc.run_model` on ``bert_base_fp16`` / ``resnet50_fp16`` (the built-ins in
  half precision, each matmul and convolution summed in float32 and rounded once, as PyTorch
  computes ``model.half()``): every matmul and convolution offloaded to cuda_mma (the
  tensor-core kernel; ResNet's convolutions as implicit GEMMs over NHWC), the rest of
  the model on TVM's default GPU pipeline (dlight's schedules); each offloaded function
  verified against TVM's build of it, the whole model's output against TVM's build of the
  untouched model on the GPU (dlight), both timed, both with the launches captured as a CUDA
  graph (tirbyoc's default for CUDA; ``--no-cuda-graph`` builds both without). Unless
  ``--no-profile``, each offloaded function is also timed alone against dlight's schedule of
  it, and the functions left to TVM alone too (`rest_times`, unfused), so the table names
  where the rest of the time goes.
* **torch**: the same network written in PyTorch (`torch_bert`, `torch_resnet50`: the same
  layers, shapes and float16 weights; its own random values), ``model.half()`` on the GPU
  (ResNet-50 in ``channels_last``, the memory format PyTorch recommends for tensor cores),
  timed eager and under ``torch.compile`` (the compile time reported beside it;
  ``--no-compile`` skips it).

Rounds: the eager timing runs before and after tirbyoc's, so its spread shows the GPU's own
drift. Writes JSON after each batch. Needs a CUDA GPU, TVM with CUDA, and torch for the peer.

    python bench/gpu_models.py --models bert,resnet50 --batches 1,8 --out bench/results/gpu_models_h100.json
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
MODELS = ("bert", "resnet50")


def progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- tirbyoc
def model_file(model: str, batch: int, layers: int, folder: Path) -> Path:
    """A model file holding the built-in model in fp16 at ``batch`` (the built-ins are batch 1)."""
    path = folder / f"{model}_fp16_b{batch}.py"
    if model == "bert":
        path.write_text("from tirbyoc.app.model_in.models import bert_base_fp16\n"
                        f"bert = bert_base_fp16(batch={batch}, seq={SEQ}, layers={layers})\n")
    else:
        path.write_text(f"from tirbyoc.app.model_in.models import resnet50_fp16\nresnet = resnet50_fp16(batch={batch})\n")
    return path


def rest_times(result, mod_path: Path, target, repeat: int) -> dict:
    """Milliseconds per call of each function no template took, alone on the GPU as TVM's
    default pipeline schedules it (times its number of calls in the model)."""

    from tirbyoc.app.model_in.legalize import legalized_model
    from tirbyoc.app.running.profiling import time_function

    mod = legalized_model(str(mod_path), ["cuda_mma"]).mod  # as the run prepared it (NHWC for convs)
    out = {}
    for f in result.report.functions:
        if f.offloaded:
            continue
        try:
            out[f.name] = {"ms": round(time_function(mod[f.name], target, repeat), 4), "calls": f.calls}
        except Exception as err:  # noqa: BLE001 - one function failing to time is a finding
            out[f.name] = {"error": str(err)[-200:]}
    return out


def run_tirbyoc(model: str, batch: int, layers: int, repeat: int, profile: bool = True,
                cuda_graph: bool = True) -> dict:
    """tirbyoc's row. ``cuda_graph``: both builds with TVM's CUDA graph rewrite (the model's
    kernel launches captured once and replayed: `relax.backend.use_cuda_graph`, tirbyoc's
    default for CUDA builds); False turns it off."""
    import tvm

    import tirbyoc
    from tirbyoc import run_model
    from tirbyoc.app.running.run import Progress

    config = {"relax.backend.use_cuda_graph": cuda_graph}
    with tempfile.TemporaryDirectory() as tmp, tvm.transform.PassContext(opt_level=tvm.transform.PassContext.current().opt_level, config=config):
        path = model_file(model, batch, layers, Path(tmp))
        t0 = time.time()
        result = run_model(str(path), ["cuda_mma"], repeat=repeat, profile=profile,
                           progress=Progress(stream=sys.stderr))
        row = result.to_json()
        row["cuda_graph"] = cuda_graph
        row["wall_s"] = round(time.time() - t0, 1)
        if profile:
            row["rest_ms"] = rest_times(result, path, tirbyoc.get_template("cuda_mma").tvm_target(), repeat)
    return row


# ---------------------------------------------------------------------------- torch
def torch_resnet50():
    """ResNet-50 v1.5 as `tirbyoc.app.model_in.models.resnet50` builds it (conv biases, no batch norm:
    the built-in folds none), in PyTorch."""
    import torch

    def conv(cin, cout, k, stride=1):
        return torch.nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=True)

    class Block(torch.nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            self.body = torch.nn.Sequential(conv(cin, width, 1), torch.nn.ReLU(), conv(width, width, 3, stride),
                                            torch.nn.ReLU(), conv(width, width * 4, 1))
            self.down = conv(cin, width * 4, 1, stride) if (stride != 1 or cin != width * 4) else None

        def forward(self, x):
            short = self.down(x) if self.down is not None else x
            return torch.relu(self.body(x) + short)

    layers, cin = [conv(3, 64, 7, 2), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1)], 64
    for width, count, stride in zip((64, 128, 256, 512), (3, 4, 6, 3), (1, 2, 2, 2)):
        for i in range(count):
            layers.append(Block(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(cin, 1000)]
    return torch.nn.Sequential(*layers)


def torch_bert(layers: int):
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


def run_torch(model_name: str, batch: int, layers: int, repeat: int, compile_too: bool) -> dict:
    import torch

    torch.manual_seed(0)
    if model_name == "bert":
        model = torch_bert(layers).half().cuda().eval()
        x = torch.randn(batch, SEQ, HIDDEN, dtype=torch.float16, device="cuda")
    else:
        model = torch_resnet50().half().cuda().eval().to(memory_format=torch.channels_last)
        x = torch.randn(batch, 3, 224, 224, dtype=torch.float16, device="cuda").to(memory_format=torch.channels_last)
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
        row = run_tirbyoc(args.model, args.batch, args.layers, args.repeat, not args.no_profile,
                          not args.no_cuda_graph)
    else:
        row = run_torch(args.model, args.batch, args.layers, args.repeat, not args.no_compile)
    print("JSON " + json.dumps(row, default=str))
    return 0


def in_process(args, which: str, batch: int, timeout: int, extra=()) -> dict:
    """One engine's row from its own process (or why there is none)."""
    cmd = [sys.executable, __file__, "--engine", which, "--model", args.model, "--batch", str(batch),
           "--layers", str(args.layers), "--repeat", str(args.repeat), *extra]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    except subprocess.TimeoutExpired as err:  # say how far it got
        tail = (err.stderr or b"")[-800:]
        return {"error": f"timed out after {timeout} s; last output: "
                         f"{tail.decode(errors='replace') if isinstance(tail, bytes) else tail}"}
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
    ap.add_argument("--model", choices=MODELS, default="bert", help=argparse.SUPPRESS)
    ap.add_argument("--models", default="bert,resnet50", help="which of bert, resnet50, in order")
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
    for args.model, batch in [(m, int(b)) for m in args.models.split(",") for b in args.batches.split(",")]:
        graph = "" if args.no_cuda_graph else ", CUDA graph"
        what = (f"BERT-base fp16, {args.layers} layers, batch {batch}, seq {SEQ}" if args.model == "bert"
                else f"ResNet-50 fp16, batch {batch}, 224x224")
        row = {"model": what + graph}
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
