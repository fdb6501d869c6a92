"""The schedule of what no template took (`nests.schedule_rest`; `tirbyoc.relax.rest` applies
it to a model): parallel rows and vector lanes per loop nest, channel-wise reductions
(`channel_reduction`), row reductions in lanes (`lane_reduction`), elementwise chains inlined
(`elementwise_chain`), exp / erf as vector arithmetic (`vector_math`). The top room: it may
import every other."""
