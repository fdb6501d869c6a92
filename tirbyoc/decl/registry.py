"""The template registry: explicit registrations plus the ``tirbyoc.templates`` entry points.

Listing reads entry-point names only; a template module is imported the first time its
template is asked for. The library never names a template module: the built-in ones are
entry points of this distribution like any third-party package's.
"""

from __future__ import annotations

from importlib import metadata

from tirbyoc.decl.template import Template
from tirbyoc.errors import RegistrationConflict, TemplateError, UnknownTemplateError

ENTRY_POINT_GROUP = "tirbyoc.templates"

_registered: dict[str, Template] = {}
_entry_points: dict[str, metadata.EntryPoint] | None = None


def _eps() -> dict[str, metadata.EntryPoint]:
    global _entry_points
    if _entry_points is None:
        found = {}
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            found.setdefault(ep.name, ep)
        _entry_points = found
    return _entry_points


def register_template(template: Template, *, replace: bool = False) -> Template:
    """Make ``template`` known under its name. Registering the same object again is a no-op;
    another template under a taken name raises unless ``replace=True``."""
    if not isinstance(template, Template):
        raise TemplateError(f"register_template expects a tirbyoc.Template, got {type(template).__name__}")
    existing = _registered.get(template.name)
    if existing is not None and existing is not template and not replace:
        raise RegistrationConflict(
            f"template {template.name!r} is already registered; pass replace=True to swap it "
            "(e.g. for a re-parameterized variant) or choose another name"
        )
    _registered[template.name] = template
    return template


def template_names() -> list[str]:
    """Names of every known template, without importing any template module."""
    return sorted(set(_registered) | set(_eps()))


def get_template(name: str) -> Template:
    """The template called ``name``; an unknown name lists the known ones."""
    if name in _registered:
        return _registered[name]
    ep = _eps().get(name)
    if ep is None:
        known = ", ".join(template_names()) or "(none)"
        raise UnknownTemplateError(
            f"unknown template {name!r}; known templates: {known}. Third-party templates "
            f"register through the {ENTRY_POINT_GROUP!r} entry-point group or register_template()"
        )
    try:
        obj = ep.load()
    except Exception as err:
        raise TemplateError(
            f"template {name!r}: loading entry point {ep.value!r} failed: {type(err).__name__}: {err}"
        ) from err
    if callable(obj) and not isinstance(obj, Template):
        obj = obj()
    if not isinstance(obj, Template):
        raise TemplateError(
            f"template {name!r}: entry point {ep.value!r} gave {type(obj).__name__}, expected a "
            "tirbyoc.Template (or a function returning one)"
        )
    if obj.name != name:
        raise TemplateError(f"entry point {name!r} provides a template named {obj.name!r}; make them equal")
    _registered[name] = obj
    return obj


def as_template(template: "str | Template") -> Template:
    """A Template given itself or its registered name (what every API that takes a template
    accepts)."""
    return get_template(template) if isinstance(template, str) else template


def templates() -> list[Template]:
    """Every known template, loaded."""
    return [get_template(n) for n in template_names()]
