"""The target a run of tirbyoc builds for: a template's own, made this machine's where it names
no CPU or one this machine can stand in for. Shared by the rooms of `tirbyoc.app`: a model's
preparation (its byte tables are computed by a build for it) and every command's builds.
"""

from __future__ import annotations

import os

from tirbyoc._tvm import isa_features, make_target
from tirbyoc.decl.host import host_target_spec


def complete_target(target):
    """The target both builds use, as a dict: an ``llvm`` target for this machine that names
    no CPU gets this machine's (``mcpu``) and core count, so that TVM's baseline is not built
    for generic x86-64 while the offloaded build calls a tuned library."""
    if not isinstance(target, dict) or target.get("kind") != "llvm" or target.get("mtriple"):
        return target
    host = {k: v for k, v in host_target_spec().items() if k != "kind"}
    if target.get("mcpu") not in (None, "", host["mcpu"]):
        host.pop("mattr", None)  # another CPU named: its own features, as declared
    return {**host, "num-cores": os.cpu_count() or 1, **{k: v for k, v in target.items() if v not in (None, "")}}


def for_this_cpu(target):
    """A template's own target as a run on this machine builds it: an ``llvm`` target naming a
    CPU (x86_vnni's ``cascadelake``) becomes this machine's CPU (``znver4``, ...) where that
    has every instruction-set feature the named one has (with the features this machine
    hides turned off, `host_target_spec`), so that LLVM tunes both builds - the
    offload, the rest of the model, TVM's baseline - for the CPU that runs them. A target for
    another machine (an ``mtriple``), or a CPU this one lacks features of, stays as declared."""
    if not isinstance(target, dict) or target.get("kind") != "llvm" or target.get("mtriple") or not target.get("mcpu"):
        return target
    host = host_target_spec()
    if not isa_features(make_target(target)) <= isa_features(host):
        return target
    return {**target, **{k: v for k, v in host.items() if k != "kind"}}


def run_target(template, target=None):
    """The target a run builds both builds for, completed (`complete_target`): ``target`` as
    given, else the template's own built for this CPU (`for_this_cpu`)."""
    return complete_target(for_this_cpu(dict(template.target)) if target is None else target)


__all__ = ["complete_target", "for_this_cpu", "run_target"]
