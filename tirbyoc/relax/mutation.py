"""What every Relax rewrite of tirbyoc's does around its `relax.PyExprMutator`: visit each
Relax function of the module, and, as a pass, fill in a report."""

from __future__ import annotations

from tvm import relax

from tirbyoc._tvm import tvm


def mutate_functions(mod, mutator):
    """``mod`` with each of its Relax functions replaced by ``mutator``'s visit of it
    (``mutator``: a `relax.PyExprMutator` made on ``mod``; its builder holds the result)."""
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


def reporting_pass(rewrite, report, name: str):
    """``rewrite`` (module -> (module, report)) as an IRModule pass named ``name``; each run's
    report is added to ``report`` when one is given."""

    @tvm.transform.module_pass(opt_level=0, name=name)
    def _pass(mod, _ctx):
        new, done = rewrite(mod)
        if report is not None:
            report.add(done)
        return new

    return _pass


__all__ = ["mutate_functions", "reporting_pass"]
