"""The wheel holds every package and data file the library imports or reads."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _config():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_subpackage_is_in_the_wheel():
    """A plain `pip install .` once lacked tirbyoc.tuning (`tirbyoc tune` failed)."""
    cfg = _config()
    listed = set(cfg["packages"])
    dirs = {"tirbyoc": ROOT / "tirbyoc", "tirbyoc_intrinsics": ROOT / cfg["package-dir"]["tirbyoc_intrinsics"]}
    found = set()
    for name, base in dirs.items():
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join((name, *rel.parts)) if rel.parts else name)
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"


def test_package_data_globs_match_files():
    cfg = _config()
    for package, globs in cfg["package-data"].items():
        top, *rest = package.split(".")
        base = ROOT / cfg.get("package-dir", {}).get(top, top) / Path(*rest)
        for glob in globs:
            assert list(base.glob(glob)), f"{package}: {glob} matches no file"


def test_the_front_door_serves_the_application():
    # README, docs, examples and benchmarks import these from tirbyoc, not from its rooms
    import tirbyoc
    from tirbyoc.app import options
    from tirbyoc.app.building import deploy
    from tirbyoc.app.model_in import legalize, loaders, models
    from tirbyoc.app.running import run
    from tirbyoc.app.sweeping import sweep
    from tirbyoc.offloading import selfcheck

    for name, module in [("run_model", run), ("RunOptions", options), ("build_library", deploy),
                         ("build_model", models), ("quantize", models), ("import_onnx", loaders),
                         ("sweep", sweep), ("search_model", sweep), ("legalized_model", legalize),
                         ("self_check", selfcheck)]:
        assert getattr(tirbyoc, name) is getattr(module, name), name
        assert name in tirbyoc.__all__
