"""Extern C libraries that intrinsic implementations call.

A library is declared with its C sources, include and library directories and the symbols it
must export. It is compiled with TVM's own compiler helper (``tvm.support.cc``: an argument
list, never a shell), cached by content hash, loaded with ``RTLD_GLOBAL`` so TVM's JIT can
resolve the symbols, and its symbols are checked at load time: a missing symbol is reported
here instead of segfaulting at the first call.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .errors import ExternLibraryError

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
    _path: Path | None = field(default=None, init=False, repr=False)
    _handle: ctypes.CDLL | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if not _SAFE_NAME.match(self.name or ""):
            raise ExternLibraryError(f"library name {self.name!r}: use letters, digits, '_', '.', '-'")
        self.sources = tuple(Path(s) for s in self.sources)
        self.symbols = tuple(check_symbol(s) for s in self.symbols)
        for d in self.defines:
            if not _IDENT.match(d.split("=", 1)[0]) or not _SAFE_NAME.match(d.replace("=", "")):
                raise ExternLibraryError(f"library {self.name!r}: unsafe define {d!r}")

    def _options(self) -> list[str]:
        opts = ["-O3", "-std=c11", "-fPIC"]
        opts += [f"-D{d}" for d in self.defines]
        for d in self.include_dirs():
            opts.append(f"-I{self._existing_dir(d)}")
        for d in self.library_dirs():
            d = self._existing_dir(d)
            opts += [f"-L{d}", f"-Wl,-rpath,{d}"]
        for lib in self.libraries():
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
            from tvm.support import cc

            tmp = out.with_suffix(f".{os.getpid()}.so")
            try:
                cc.create_shared(
                    str(tmp), [str(s) for s in self.sources], options=opts, cc=c_compiler()
                )
            except Exception as err:
                raise ExternLibraryError(f"library {self.name!r}: compilation failed: {err}") from err
            os.replace(tmp, out)
        self._path = out
        return out

    def load(self) -> ctypes.CDLL:
        """Build if needed, load globally, and check every declared symbol is exported."""
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

    @property
    def path(self) -> Path:
        return self.build()
