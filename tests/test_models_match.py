"""Matching legalized full-size models: every block gets a match or a reason."""

import tirbyoc
from tirbyoc.app.model_in.loaders import legalize
from tirbyoc.app.model_in.models import build_model


def test_resnet50_convs_and_dense_match_blas_everything_else_has_a_reason():
    mod = legalize(build_model("resnet50"))
    results = tirbyoc.explain(mod, "blas")
    convs = [r for r in results if r.block.startswith("conv2d")]
    assert len(convs) >= 10 and all(r.best is not None for r in convs)
    assert all(set(r.best.mapping["vk"]) >= {"v_rc"} for r in convs)
    assert any(r.block == "matmul" and r.best for r in results)
    for r in results:
        assert (r.best is None) != (r.reason is None), r


def test_bert_base_matmuls_match():
    mod = legalize(build_model("bert_base"))
    results = tirbyoc.explain(mod, "blas")
    matmuls = [r for r in results if "matmul" in r.block]
    assert matmuls and all(r.best for r in matmuls)
