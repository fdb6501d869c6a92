"""The per-block pipeline's stages and their planners: operands cast, commuted, staged and
padded (`cast_staging`, `stages`, `staging`), tiles moved into bounded scratchpads by DMA
(`scratchpad`, `dma`, `block_dma`, `addresses`), an accelerator's epilogue on its ALU
(`epilogue`, `epilogue_chain`), tensor-core kernels (`gemm_form`, `tensor_core`, `cuda`), and
`tensorize`, the entry that runs them for a match. Imports the foundation, functions and cpu
rooms."""
