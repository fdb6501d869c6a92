"""The package's layering, checked on its source (docs/architecture.md describes the layers).

Each subpackage is a layer and imports only the layers below it; the TIR core reaches TVM only
through `tirbyoc._tvm`; no module takes another's private names; modules and functions stay
small; an import inside a function says why it is deferred. `layer_violations` is a plain
function so that a test can plant a violation and see it caught.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tirbyoc"

# Bottom to top. Root modules (_tvm, errors, dtypes) are below every layer; the package's
# __init__ and __main__ are its front door and may import anything.
LAYERS = ("decl", "ir", "matching", "rewrite", "offloading", "sim", "relax", "tuning", "app", "testing")
ROOT_MODULES = {"__init__", "__main__", "_tvm", "errors", "dtypes"}
# The TIR core spells TVM through _tvm (one file to change on the next rename); the layers
# above it drive Relax, MetaSchedule and the runtime, whose APIs they use directly.
TVM_THROUGH_DOOR = {"decl", "ir", "matching", "rewrite", "offloading"}
# Rooms inside a layer, lowest first: a room imports only the rooms before it and the modules
# at the layer's top (its shared records), which import no room.
ROOMS = {"rewrite": ("foundation", "functions", "cpu", "block", "rest_schedule"),
         "app": ("model_in", "running", "building", "sweeping", "commands")}
ROOM_SHARED = {"rewrite": {"__init__"}, "app": {"__init__", "options", "jsonout", "run_target"}}
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 8  # beyond that, a record (RunOptions, SearchPlan, TuneSettings) travels instead
DEFERRED = re.compile(r"#\s*deferred:")


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.detail}"


def _layer(parts: tuple[str, ...]) -> str:
    """'root' for tirbyoc/<module>.py, else the subpackage name."""
    return parts[1] if len(parts) > 2 else "root"


def _rank(layer: str) -> int:
    return -1 if layer == "root" else LAYERS.index(layer)


def _module_parts(path: Path) -> tuple[str, ...]:
    return path.relative_to(PACKAGE.parent).with_suffix("").parts


def _imported(node, parts: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """(dotted module, names) for each tirbyoc or tvm module an import statement names."""
    if isinstance(node, ast.Import):
        return [(a.name, []) for a in node.names]
    if node.level:
        base = list(parts[:-node.level])
        return [(".".join(base + ([node.module] if node.module else [])), [a.name for a in node.names])]
    return [(node.module or "", [a.name for a in node.names])]


def _target_layer(module: str, names: list[str]) -> list[str]:
    bits = module.split(".")
    if bits[0] != "tirbyoc":
        return []
    if len(bits) == 1:  # from tirbyoc import x: a layer when x is a subpackage
        return [n if n in LAYERS else "root" for n in names]
    return [bits[1] if bits[1] in LAYERS else "root"]


def _function_imports(tree) -> set[int]:
    """Line numbers of import statements nested in a function."""
    out = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out |= {n.lineno for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return out


def _said_why(lines: list[str], lineno: int) -> bool:
    """A '# deferred:' comment on the import's line or just above the group of imports it
    belongs to."""
    i = lineno - 1
    if DEFERRED.search(lines[i]):
        return True
    while i > 0 and lines[i - 1].strip().startswith(("import ", "from ")):
        i -= 1
    return i > 0 and bool(DEFERRED.search(lines[i - 1]))


def parameters(node) -> int:
    """The parameters a function takes (``self`` / ``cls`` not counted; ``*args`` and
    ``**kwargs`` one each)."""
    a = node.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return n - (1 if a.args and a.args[0].arg in ("self", "cls") else 0)


def _room(parts: tuple[str, ...]) -> str | None:
    """The room of tirbyoc/<layer>/<room>/<module>.py; None at the layer's top."""
    return parts[2] if len(parts) > 3 else None


def _room_violations(rel: str, parts: tuple[str, ...], node, module: str) -> list[Violation]:
    layer = _layer(parts)
    rooms = ROOMS.get(layer)
    bits = module.split(".")
    if not rooms or bits[:2] != ["tirbyoc", layer] or len(bits) < 3:
        return []
    mine, theirs = _room(parts), bits[2]
    if theirs not in rooms:
        return []
    if mine is None and parts[-1] != "__init__":
        return [Violation(rel, node.lineno, "room import", f"{layer}'s shared {parts[-1]} imports the {theirs} room")]
    if mine is not None and rooms.index(theirs) > rooms.index(mine):
        return [Violation(rel, node.lineno, "room import", f"the {mine} room imports the {theirs} room (after it)")]
    return []


def check_rooms_listed() -> list[str]:
    """Modules at a roomed layer's top that are not its shared records, and rooms not listed."""
    out = []
    for layer, rooms in ROOMS.items():
        top = PACKAGE / layer
        out += [f"{layer}/{p.name}: outside the rooms" for p in top.glob("*.py") if p.stem not in ROOM_SHARED[layer]]
        out += [f"{layer}/{d.name}/: a room not in ROOMS" for d in top.iterdir()
                if d.is_dir() and (d / "__init__.py").exists() and d.name not in rooms]
    return out


def check_file(path: Path, text: str) -> list[Violation]:
    rel = str(path.relative_to(ROOT))
    parts = _module_parts(path)
    layer = _layer(parts)
    lines = text.splitlines()
    tree = ast.parse(text)
    out: list[Violation] = []
    if len(lines) > MAX_FILE_LINES:
        out.append(Violation(rel, 1, "file too long", f"{len(lines)} lines > {MAX_FILE_LINES}"))
    nested = _function_imports(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            size = node.end_lineno - node.lineno + 1
            if size > MAX_FUNCTION_LINES:
                out.append(Violation(rel, node.lineno, "function too long",
                                     f"{node.name}: {size} lines > {MAX_FUNCTION_LINES}"))
            if parameters(node) > MAX_PARAMETERS:
                out.append(Violation(rel, node.lineno, "too many parameters",
                                     f"{node.name}: {parameters(node)} > {MAX_PARAMETERS}"))
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if node.lineno in nested and not _said_why(lines, node.lineno):
                out.append(Violation(rel, node.lineno, "import inside a function",
                                     "move it to the top, or say why it waits in a '# deferred:' comment"))
        for module, names in _imported(node, parts):
            top = module.split(".")[0]
            out += _room_violations(rel, parts, node, module)
            if top in ("tvm", "tvm_ffi") and layer in TVM_THROUGH_DOOR:
                out.append(Violation(rel, node.lineno, "TVM outside the door",
                                     f"layer {layer!r} imports {module}: use tirbyoc._tvm"))
            if layer in ("root",) and parts[-1] in ("__init__", "__main__"):
                continue
            for target in _target_layer(module, names):
                if _rank(target) > _rank(layer):
                    out.append(Violation(rel, node.lineno, "upward import",
                                         f"{layer} imports {module} ({target} is above it)"))
            private = [n for n in names if n.startswith("_") and n != "__version__"]
            if top == "tirbyoc" and private:
                out.append(Violation(rel, node.lineno, "private name crosses modules",
                                     f"{', '.join(private)} from {module}"))
    return out


def layer_violations(overrides: dict[Path, str] | None = None) -> list[Violation]:
    """Every violation in the package; ``overrides`` replaces some files' text (for tests)."""
    overrides = overrides or {}
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        out += check_file(path, overrides.get(path, path.read_text()))
    return out


def test_package_is_layered():
    problems = layer_violations()
    assert not problems, "\n".join(map(str, problems))


def test_the_application_is_in_rooms_by_command():
    assert not check_rooms_listed(), check_rooms_listed()
    victim = PACKAGE / "app" / "model_in" / "legalize.py"
    planted = victim.read_text() + "\nfrom tirbyoc.app.running.run import run_model\n"
    problems = [p for p in check_file(victim, planted) if p.rule == "room import"]
    assert [p.detail for p in problems] == ["the model_in room imports the running room (after it)"], problems
    shared = PACKAGE / "app" / "options.py"
    planted = shared.read_text() + "\nfrom tirbyoc.app.model_in import sizes\n"
    assert [p.rule for p in check_file(shared, planted) if p.rule == "room import"] == ["room import"]


def test_the_rewrite_is_in_rooms_by_role():
    victim = PACKAGE / "rewrite" / "cpu" / "register_blocks.py"
    planted = victim.read_text() + "\nfrom tirbyoc.rewrite.block.staging import relayout\n"
    problems = [p for p in check_file(victim, planted) if p.rule == "room import"]
    assert [p.detail for p in problems] == ["the cpu room imports the block room (after it)"], problems


def test_a_planted_upward_import_is_caught():
    victim = PACKAGE / "ir" / "pattern.py"
    planted = victim.read_text() + "\nfrom tirbyoc.app.running.run import run_model\n"
    problems = [p for p in layer_violations({victim: planted}) if p.rule == "upward import"]
    assert [p.path for p in problems] == ["tirbyoc/ir/pattern.py"], problems


def test_planted_tvm_import_private_name_and_lazy_import_are_caught():
    victim = PACKAGE / "matching" / "unify.py"
    planted = victim.read_text() + (
        "\nimport tvm\nfrom tirbyoc.ir.pattern import _private\n\n\ndef f():\n    import numpy\n")
    rules = {p.rule for p in check_file(victim, planted)}
    assert {"TVM outside the door", "private name crosses modules", "import inside a function"} <= rules


def test_a_planted_long_signature_is_caught():
    victim = PACKAGE / "matching" / "unify.py"
    planted = victim.read_text() + "\n\ndef f(a, b, c, d, e, f, g, h, *, i=0):\n    return a\n"
    problems = [p for p in check_file(victim, planted) if p.rule == "too many parameters"]
    assert [p.detail for p in problems] == ["f: 9 > 8"], problems
    method = "\n\nclass C:\n    def m(self, a, b, c, d, e, f, g, h):\n        return a\n"
    assert not [p for p in check_file(victim, victim.read_text() + method) if p.rule == "too many parameters"]


def test_root_holds_only_the_shared_modules_and_the_layers():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert modules == ROOT_MODULES
    assert packages == set(LAYERS)


def test_architecture_doc_names_every_layer_and_no_other():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    named = re.findall(r"^## \d+\. .*? — `tirbyoc/(\w+)/`", doc, flags=re.M)
    assert named == list(LAYERS), named


def test_templates_use_only_the_public_api():
    public = re.compile(r"^tirbyoc(\.(decl(\.\w+)?|sim))?$")
    for path in sorted((ROOT / "intrinsics").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tirbyoc."):
                assert public.match(node.module), f"{path.name}: imports {node.module}"
                assert not any(a.name.startswith("_") for a in node.names), path.name


# The passes on a whole offloaded function and the module that runs them, in order, for the
# rewrite engine's result and a tuned schedule's alike (issue: a second, unnamed pipeline).
FUNCTION_PASSES = {"read_in_place", "bind_unbound_nests", "plan_double_buffering"}


def test_function_level_passes_run_only_through_the_named_steps():
    callers = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in FUNCTION_PASSES:
                callers.add(path.relative_to(PACKAGE).as_posix())
    assert callers == {"offloading/function_steps.py"}, callers


def test_the_stage_order_is_written_in_one_place():
    # every stage module registers by a name from pipeline.ORDER; no module orders stages itself
    for path in sorted((PACKAGE / "rewrite").rglob("*.py")):
        text = path.read_text()
        assert "after=" not in text and "before=" not in text.replace("before=list", ""), path.name


# Where a target's code runs, how it runs here and how it is timed and deployed are the device
# records' (tirbyoc/offloading/devices.py); the layers from offloading up ask them.
DEVICE_LAYERS = ("offloading", "sim", "relax", "tuning", "app", "testing")
DEVICE_MODULES = {"offloading/devices.py", "offloading/hexagon.py", "offloading/cuda_toolchain.py"}
KIND_LITERALS = {"cuda", "hexagon"}


def _kind_branches(tree) -> list[int]:
    """Lines that call is_hexagon or compare something with a device kind's name."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "is_hexagon":
            lines.append(node.lineno)
        if isinstance(node, ast.Compare) and any(
                isinstance(c, ast.Constant) and c.value in KIND_LITERALS for c in [node.left, *node.comparators]):
            lines.append(node.lineno)
    return lines


def test_no_target_kind_branch_outside_the_device_records():
    found = {}
    for layer in DEVICE_LAYERS:
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            rel = path.relative_to(PACKAGE).as_posix()
            if rel not in DEVICE_MODULES and (lines := _kind_branches(ast.parse(path.read_text()))):
                found[rel] = lines
    assert not found, found


def test_a_planted_kind_branch_is_caught():
    assert _kind_branches(ast.parse("if is_hexagon(t):\n    pass\nx = kind == 'cuda'\n")) == [1, 3]


def test_template_modules_stay_small():
    # intrinsics/ declares templates as data on the public API: the package's size limits hold there too
    problems = []
    for path in sorted((ROOT / "intrinsics").glob("*.py")):
        lines = path.read_text().splitlines()
        if len(lines) > MAX_FILE_LINES:
            problems.append(f"{path.name}: {len(lines)} lines > {MAX_FILE_LINES}")
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                problems.append(f"{path.name}:{node.lineno}: {node.name} > {MAX_FUNCTION_LINES} lines")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and parameters(node) > MAX_PARAMETERS:
                problems.append(f"{path.name}:{node.lineno}: {node.name} takes {parameters(node)} > "
                                f"{MAX_PARAMETERS} parameters")
    assert not problems, problems
