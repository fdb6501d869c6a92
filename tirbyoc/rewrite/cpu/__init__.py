"""The CPU schedule family: register blocks and parallel loops around a core
(`register_blocks`), the weights laid out panel by panel and prefetched tile by tile (`weight_layout`,
`prefetch`), register blocks kept on the stack (`stack`), the rows' staging inside each task
(`row_staging`), and the write-back an integer core's epilogue is fused into (`cpu_epilogue`,
with its exact arithmetic: `integer_writeback`, `exact_division`, `finite_division`).
Imports the foundation and functions rooms."""
