"""Extern C libraries that intrinsic implementations call, and packed functions a Relax
module calls.

A library is declared with its C sources, include and library directories and the symbols it
must export. It is compiled with TVM's own compiler helper (``tvm.support.cc``: an argument
list, never a shell) and cached by content hash. Two kinds:

* plain C (``ffi=False``): loaded with ``RTLD_GLOBAL`` so TVM's JIT resolves the
  ``T.call_extern`` symbols of tensorized PrimFuncs;
* TVM FFI (``ffi=True``): the sources include ``<tvm/ffi/c_api.h>`` (and tirbyoc's
  ``<tirbyoc_ffi.h>`` helpers) and export packed functions ``__tvm_ffi_<symbol>`` (TVM's
  ``TVMFFISafeCallType``); the library is loaded as a
  TVM runtime module, to be attached to a Relax module's ``external_mods`` and called through
  ``R.call_dps_packed("<symbol>", ...)``.

Either way every declared symbol is checked at load time: a missing symbol is reported here
instead of segfaulting at the first call.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from tirbyoc.errors import ExternLibraryError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def check_symbol(name: str) -> str:
    """Return ``name`` if it is a C identifier, else raise."""
    if not isinstance(name, str) or not _IDENT.match(name):
        raise ExternLibraryError(f"extern symbol {name!r} is not a C identifier")
    return name


def cache_dir() -> Path:
    root = os.environ.get("TIRBYOC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tirbyoc"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def c_compiler() -> str:
    """The C compiler (``$CC`` or ``cc``) as an absolute path; TVM's default is a C++ one,
    which would mangle the symbols."""
    name = os.environ.get("CC", "cc")
    path = shutil.which(name)
    if path is None or not _SAFE_NAME.match(os.path.basename(path)):
        raise ExternLibraryError(f"no usable C compiler {name!r}; install gcc or set CC to its path")
    return path


PathsFn = Callable[[], Sequence[str]]


@dataclass(eq=False)
class ExternLibrary:
    """C code an implementation calls through ``T.call_extern``.

    ``include_dirs``, ``library_dirs`` and ``libraries`` are callables so that locating a
    dependency (e.g. ``scipy_openblas32``) happens only when the library is built.
    """

    name: str
    sources: Sequence[Path]
    symbols: Sequence[str]
    include_dirs: PathsFn = lambda: ()
    library_dirs: PathsFn = lambda: ()
    libraries: PathsFn = lambda: ()
    defines: Sequence[str] = ()
    ffi: bool = False
    # ffi=True: the global names its packed functions are called by (name -> symbol; default
    # each symbol under its own name) - what a deployed library registers when it loads
    globals: Mapping[str, str] | None = None
    _path: Path | None = field(default=None, init=False, repr=False)
    _handle: ctypes.CDLL | None = field(default=None, init=False, repr=False)
    _module: object = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if not _SAFE_NAME.match(self.name or ""):
            raise ExternLibraryError(f"library name {self.name!r}: use letters, digits, '_', '.', '-'")
        self.sources = tuple(Path(s) for s in self.sources)
        self.symbols = tuple(check_symbol(s) for s in self.symbols)
        for d in self.defines:
            if not _IDENT.match(d.split("=", 1)[0]) or not _SAFE_NAME.match(d.replace("=", "")):
                raise ExternLibraryError(f"library {self.name!r}: unsafe define {d!r}")

    def global_names(self) -> dict[str, str]:
        """Global function name -> C symbol (``__tvm_ffi_<symbol>``) of an ``ffi=True`` library."""
        return dict(self.globals) if self.globals else {s: s for s in self.symbols}

    def compile_options(self, defines: Sequence[str] = ()) -> list[str]:
        """Flags that compile one source to a position-independent object."""
        opts = ["-O3", "-std=c11", "-fPIC", *(f"-D{d}" for d in (*self.defines, *defines))]
        includes = list(self.include_dirs())
        if self.ffi:
            # deferred: `import tirbyoc` stays free of TVM (importing it costs ~1.3 s)
            from tirbyoc._tvm import ffi_build_paths

            includes += [str(Path(__file__).parent / "include"), *ffi_build_paths()[0]]
        return opts + [f"-I{self._existing_dir(d)}" for d in includes]

    def objects(self, workdir: Path, defines: Sequence[str] = (), sources=None) -> list[Path]:
        """The sources (``sources``: those of them) compiled to objects in ``workdir`` (for
        linking into a deployed library; ``defines`` adds -D flags, e.g. a simulator's
        configuration)."""
        opts = self.compile_options(defines)
        out = []
        for src in (self.sources if sources is None else sources):
            obj = Path(workdir) / f"{self.name}.{src.stem}.o"
            run = subprocess.run([c_compiler(), "-c", str(src), "-o", str(obj), *opts],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                raise ExternLibraryError(f"library {self.name!r}: compiling {src.name} failed:\n"
                                         f"{run.stderr.strip()}")
            out.append(obj)
        return out

    def dependencies(self) -> list[Path]:
        """The shared libraries it links (``libraries`` found in ``library_dirs``): what a
        deployed library must ship beside it. TVM FFI is not one: the process that loads a
        TVM module has it already."""
        found = []
        for lib in self.libraries():
            hits = [Path(d) / f"lib{lib}.so" for d in self.library_dirs() if (Path(d) / f"lib{lib}.so").exists()]
            if not hits:
                raise ExternLibraryError(f"library {self.name!r}: lib{lib}.so is in none of "
                                         f"{list(self.library_dirs())}")
            found.append(hits[0].resolve())
        return found

    def _options(self) -> list[str]:
        opts = ["-O3", "-std=c11", "-fPIC"]
        opts += [f"-D{d}" for d in self.defines]
        includes, libdirs, libs = list(self.include_dirs()), list(self.library_dirs()), list(self.libraries())
        if self.ffi:
            # deferred: `import tirbyoc` stays free of TVM (importing it costs ~1.3 s)
            from tirbyoc._tvm import ffi_build_paths

            ffi_includes, ffi_libdir = ffi_build_paths()
            includes += [str(Path(__file__).parent / "include"), *ffi_includes]
            libdirs.append(ffi_libdir)
            libs.append("tvm_ffi")
        for d in includes:
            opts.append(f"-I{self._existing_dir(d)}")
        for d in libdirs:
            d = self._existing_dir(d)
            opts += [f"-L{d}", f"-Wl,-rpath,{d}"]
        if libs:
            # TVM's compiler driver puts these options before the sources, where a linker that
            # defaults to --as-needed (Debian's, Ubuntu's) drops every library: the object then
            # loads only into a process that already holds them (not a tuning worker, not a
            # fresh process loading an exported module).
            opts.append("-Wl,--no-as-needed")
        for lib in libs:
            if not _SAFE_NAME.match(lib):
                raise ExternLibraryError(f"library {self.name!r}: unsafe link name {lib!r}")
            opts.append(f"-l{lib}")
        return opts

    def _existing_dir(self, d: str) -> str:
        path = Path(d)
        if not path.is_dir():
            raise ExternLibraryError(f"library {self.name!r}: directory {d!r} does not exist")
        return str(path.resolve())

    def build(self) -> Path:
        """Compile to a shared object in the cache (reused while sources and flags match)."""
        if self._path is not None and self._path.exists():
            return self._path
        for src in self.sources:
            if not src.is_file():
                raise ExternLibraryError(f"library {self.name!r}: source {src} does not exist")
        opts = self._options()
        digest = hashlib.sha256()
        for src in self.sources:
            digest.update(src.read_bytes())
        digest.update("\0".join(opts).encode())
        out = cache_dir() / f"{self.name}-{digest.hexdigest()[:16]}.so"
        if not out.exists():
            # deferred: `import tirbyoc` stays free of TVM (importing it costs ~1.3 s)
            from tirbyoc._tvm import create_shared

            tmp = out.with_suffix(f".{os.getpid()}.so")
            try:
                create_shared(str(tmp), [str(s) for s in self.sources], opts, c_compiler()
                )
            except Exception as err:
                raise ExternLibraryError(f"library {self.name!r}: compilation failed: {err}") from err
            os.replace(tmp, out)
        self._path = out
        return out

    def load(self) -> ctypes.CDLL:
        """Build if needed, load globally, and check every declared symbol is exported."""
        if self.ffi:
            raise ExternLibraryError(f"library {self.name!r} exports TVM packed functions; "
                                     "load it with runtime_module()")
        if self._handle is None:
            path = self.build()
            try:
                handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            except OSError as err:
                raise ExternLibraryError(f"library {self.name!r}: cannot load {path}: {err}") from err
            missing = [s for s in self.symbols if not hasattr(handle, s)]
            if missing:
                raise ExternLibraryError(
                    f"library {self.name!r} ({path}) does not export {missing}; the module "
                    "would crash at its first call"
                )
            self._handle = handle
        return self._handle

    def runtime_module(self):
        """Build if needed and load as a TVM runtime module (``ffi=True`` libraries), checking
        that it implements every declared packed function."""
        if not self.ffi:
            raise ExternLibraryError(f"library {self.name!r} is plain C (ffi=False); its "
                                     "symbols are called through T.call_extern, use load()")
        if self._module is None:
            # deferred: `import tirbyoc` stays free of TVM (importing it costs ~1.3 s)
            from tirbyoc._tvm import load_module

            path = self.build()
            try:
                module = load_module(str(path))
            except Exception as err:
                raise ExternLibraryError(f"library {self.name!r}: TVM cannot load {path}: {err}") from err
            missing = [s for s in self.symbols if not module.implements_function(s)]
            if missing:
                raise ExternLibraryError(
                    f"library {self.name!r} ({path}) does not export the packed functions "
                    f"{missing} (C symbols __tvm_ffi_<name>); a call would fail at run time")
            self._module = module
        return self._module

    @property
    def path(self) -> Path:
        return self.build()




def extern_symbols(func) -> list[str]:
    """The C symbols a PrimFunc calls through ``T.call_extern``, read from the IR (not from its
    printed text, where a name in a string or a comment would count)."""
    from tirbyoc._tvm import PrimCall, StringImm, tvm_ffi  # deferred: TVM loads only when IR is read

    names = set()

    def visit(call):
        if str(getattr(call.op, "name", "")) == "tirx.call_extern" and call.args and isinstance(call.args[0], StringImm):
            names.add(str(call.args[0].value))

    tvm_ffi.structural_walk(func, [(PrimCall, visit)], order="pre")
    return sorted(names)


def missing_symbols(func) -> list[str]:
    """The extern symbols ``func`` calls that nothing loaded in this process exports. TVM's
    JIT compiles such a call and then crashes the process at the first call ("Symbols not
    found"); ask this before running host code."""
    process = ctypes.CDLL(None)
    return [s for s in extern_symbols(func) if not hasattr(process, s)]


def check_loaded(func, what: str = "the function") -> None:
    """Raise `ExternLibraryError` if ``func`` calls an extern symbol that is not loaded."""
    missing = missing_symbols(func)
    if missing:
        raise ExternLibraryError(
            f"{what} calls extern symbol(s) {missing} that no library loaded in this process "
            "exports; declare the library that defines them in the template's `libraries` "
            "(ExternLibrary(..., symbols=[...])) so tirbyoc builds and loads it first. Running "
            "it as is would crash the process at the first call.")


@dataclass(frozen=True, eq=False)
class PackedFunction:
    """A whole-computation library kernel, called from Relax in destination-passing style.

    ``R.call_dps_packed(symbol, (inputs..., ), out)`` passes the inputs in the order of the
    group's compute intrinsic operands, then the output; the kernel overwrites the output
    with the group's computation started from a zero accumulator (a PrimFunc's ``init``).
    ``library`` is an ``ffi=True`` `ExternLibrary` that exports ``symbol``.
    """

    symbol: str
    library: ExternLibrary
    doc: str = ""

    def __post_init__(self):
        check_symbol(self.symbol)
        if not isinstance(self.library, ExternLibrary) or not self.library.ffi:
            raise ExternLibraryError(f"packed function {self.symbol!r}: library must be an "
                                     "ExternLibrary declared with ffi=True")
        if self.symbol not in self.library.symbols:
            raise ExternLibraryError(f"packed function {self.symbol!r} is not among library "
                                     f"{self.library.name!r}'s symbols {list(self.library.symbols)}")

    def function(self):
        """The loaded packed function (``tvm_ffi.Function``)."""
        return self.library.runtime_module()[self.symbol]
