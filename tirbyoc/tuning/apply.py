"""Apply a tuning database: the tuned schedule of each PrimFunc that has a record.

`tuned_schedules` returns the hook `tirbyoc.offload` (and so ``OffloadTIR`` and ``tirbyoc run
--database``) asks before rewriting a function itself: the function is prepared exactly as
`tune` prepared it, looked up by MetaSchedule's structural key, and the best record's trace is
replayed on it. The offload then treats the result like any rewrite - checks it numerically
against TVM's build of the original and falls back to its own rewrite if it disagrees.
"""

from __future__ import annotations

import json
import os

from tvm.s_tir.meta_schedule.database import JSONDatabase

from tirbyoc._tvm import tirx
from tirbyoc.decl.registry import get_template, templates
from tirbyoc.errors import TirbyocError
from tirbyoc.tuning.build import tuning_target
from tirbyoc.tuning.preparation import best_matches, prepare
from tirbyoc.tuning.tasks import workload

MANIFEST = "tirbyoc_tuning.json"  # which template a work directory was tuned for


def write_manifest(work_dir: str, template) -> None:

    with open(os.path.join(work_dir, MANIFEST), "w") as f:
        json.dump({"template": template.name}, f)


def load_database(work_dir: str):
    """The JSON database `tune` wrote in ``work_dir`` (a clear error if there is none).
    Its records name the template's intrinsics, so that template's are registered first
    (every registered template's when the directory does not say which)."""



    records = os.path.join(work_dir, "database_tuning_record.json")
    workloads = os.path.join(work_dir, "database_workload.json")
    if not (os.path.isfile(records) and os.path.isfile(workloads)):
        raise TirbyocError(f"--database {work_dir}: no MetaSchedule database there (expected "
                           "database_workload.json and database_tuning_record.json; run "
                           "`tirbyoc tune --work-dir DIR` first)")
    manifest = os.path.join(work_dir, MANIFEST)
    try:
        with open(manifest) as f:
            tuned_for = [get_template(json.load(f)["template"])]
    except (OSError, KeyError, ValueError, TirbyocError):
        tuned_for = templates()
    for template in tuned_for:
        template.register()
    try:
        return JSONDatabase(workloads, records, allow_missing=False)
    except Exception as err:  # noqa: BLE001 - TVM's parse error, said plainly
        last = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise TirbyocError(f"--database {work_dir}: MetaSchedule cannot read it: {last}") from None


def tuned_schedules(database, *, target=None):
    """``lookup(func, template) -> (new_func, {block: intrinsic}) | None`` over ``database``
    (a MetaSchedule Database or a work directory), for `tirbyoc.offload`'s ``tuned``."""
    if isinstance(database, str):
        database = load_database(database)

    def lookup(func, template):

        prepared = prepare(func, template)
        matches = best_matches(prepared, template)
        if not matches:
            return None
        template.register()  # a replayed trace names the template's intrinsics
        sch = database.query_schedule(workload(prepared), tuning_target(template, target),
                                      workload_name="main")
        if sch is None:
            return None
        used = {str(inst.attrs[0]) for inst in sch.trace.insts if inst.kind.name == "Tensorize"}
        tuned = sch.mod["main"]
        # the function's own attributes back (its name, visibility), not the workload's
        new = tirx.PrimFunc(tuned.params, tuned.body, tuned.ret_type, func.attrs)
        return new, {b: m.intrinsic.name for b, m in matches.items() if m.intrinsic.name in used}

    return lookup


__all__ = ["MANIFEST", "load_database", "tuned_schedules", "write_manifest"]
