"""A Llama-style decoder layer whose sequence length is known only at run time, on blas.

The layer (`tirbyoc.app.model_in.llm.llama_layer`: RMSNorm, rotary embedding, attention over a sequence
of ``seq`` tokens, a SiLU-gated MLP; random weights) is offloaded once with ``seq`` symbolic:
each function is checked at seq = 1, 7, 16, 17 and 131 on the way; the attention's q.k^T and
p.v become one batched GEMM call each that reads ``seq`` from its arguments. One build of each
(TVM's and tirbyoc's) then runs at every length, compared and timed.

    python examples/llama_decoder.py
"""

from tirbyoc import run_model

LENGTHS = (1, 17, 128)


def main(lengths=LENGTHS):
    result = run_model("builtin:llama_layer", ["blas"], sizes={"seq": tuple(lengths)}, repeat=3)
    for run in result.sizes:
        print(f"seq={run.sizes['seq']:4}: {run.coverage:.1%} of {run.total_macs:,} MACs offloaded, "
              f"outputs {'match' if run.verified else 'DIFFER'}, "
              f"{run.latency_ms.get('offloaded', float('nan')):.3f} ms (TVM {run.latency_ms.get('baseline', float('nan')):.3f} ms)")
    return result


if __name__ == "__main__":
    main()
