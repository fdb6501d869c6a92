"""Differential fuzzing in CI: seeded random workloads x the templates that run here.

Every case must end verified or as a clean fallback with a reason; a wrong result or an
exception escaping `offload` fails the test with the case, so it can be replayed with
``tirbyoc.testing.fuzz.run_case(tirbyoc.testing.fuzz.case(seed, index, templates))``. The long mode is
``python -m tirbyoc.testing.fuzz --cases 10000`` (README).
"""

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tirbyoc.matching.results import MatchStage, Mismatch
from tirbyoc.testing import fuzz

TEMPLATES = fuzz.runnable_templates()
REGRESSIONS = Path(__file__).with_name("regressions.json")

pytestmark = pytest.mark.skipif(not TEMPLATES, reason="no template runs on this machine")


def check(outcome):
    assert outcome.outcome in ("verified", "fallback", "failure")
    assert outcome.outcome != "failure", (
        f"{outcome.case.describe()} (seed {outcome.case.seed}, index {outcome.case.index}): "
        f"{outcome.category}: {outcome.detail}")
    if outcome.outcome == "fallback":
        assert outcome.detail, "a fallback must say why"


def test_seeded_run_has_no_failures_and_offloads_something():
    summary = fuzz.run(300, seed=2026, templates=TEMPLATES)
    for o in summary.outcomes:
        check(o)
    counts = summary.counts()
    # the generator must reach the rewrites (a depthwise conv drawn for a host CPU's vector
    # template falls back by design: `tirbyoc.offloading.channel_wise`)
    assert counts.get("verified", 0) >= 55, summary.table()
    assert len(summary.by("verified")) >= 3, summary.table()
    # the generator draws sizes known only at run time too, and some of them offload
    assert any(o.case.params.get("symbolic") and o.outcome == "verified" for o in summary.outcomes)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), index=st.integers(0, 10**6))
def test_hypothesis_cases(seed, index):
    check(fuzz.run_case(fuzz.case(seed, index, TEMPLATES)))


def regressions():
    return json.loads(REGRESSIONS.read_text()) if REGRESSIONS.exists() else []


@pytest.mark.parametrize("saved", regressions(), ids=lambda c: f"{c['kind']}-{c['template']}-{c['index']}")
def test_saved_regressions(saved):
    """Cases that once failed (the fuzzer's --save-failures, or bugs found elsewhere: a 1x1
    conv's OIHW weight w[k, c, 0, 0] passed in place to TVM's tensorize), replayed as found.
    Each must now rewrite and verify."""
    case = fuzz.Case(**saved)
    if case.template not in TEMPLATES:
        pytest.skip(f"{case.template} does not run here")
    outcome = fuzz.run_case(case)
    check(outcome)
    assert outcome.outcome == "verified", outcome.detail


def test_every_kind_and_outcome_is_reachable():
    kinds = {fuzz.case(1, i, TEMPLATES).kind for i in range(200)}
    assert kinds == set(fuzz.KINDS)
    dtype = Mismatch(MatchStage.DTYPE, "operand A is float32, intrinsic wants int8", operand="A",
                     expected="int8", found="float32")
    assert fuzz.categorize(dtype) == "dtype"
    assert fuzz.categorize(Mismatch(MatchStage.OPERATION, "body is max, intrinsic is multiply-add")) \
        == "not multiply-add"
    assert fuzz.categorize(Mismatch(MatchStage.ITERATORS, "no iterator plays axis j", iterator="j")) \
        == "no GEMM axis (GEMV, depthwise)"
