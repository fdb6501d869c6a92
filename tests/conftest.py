import pytest

import tirbyoc


@pytest.fixture(scope="session")
def all_templates():
    return tirbyoc.templates()


@pytest.fixture(scope="session")
def vector_target():
    """A target whose vector code this CPU runs: AVX-512 (skylake-avx512) where it has it,
    else this CPU as it is (AVX2 on a machine that hides or lacks AVX-512)."""
    from tirbyoc.decl.host import host_cpu_features, host_target_spec

    return {"kind": "llvm", "mcpu": "skylake-avx512"} if "avx512f" in host_cpu_features() else host_target_spec()
