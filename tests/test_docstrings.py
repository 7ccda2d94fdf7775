"""Every public name has a docstring: each class and function a module exports in its
``__all__``, and each public method of those classes (the API reference is generated from
them, ``./dev.sh docs``)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import staticattn


def _public_objects():
    for info in pkgutil.walk_packages(staticattn.__path__, "staticattn."):
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name, None)
            if getattr(obj, "__module__", None) != module.__name__:
                continue  # re-exported: checked where it is defined
            if inspect.isclass(obj) or inspect.isfunction(obj):
                yield f"{info.name}.{name}", obj
                if inspect.isclass(obj):
                    for attr, value in vars(obj).items():
                        if not attr.startswith("_") and inspect.isfunction(value):
                            yield f"{info.name}.{name}.{attr}", value


def test_every_public_name_has_a_docstring():
    names = dict(_public_objects())
    assert len(names) > 100  # the walk reached the package
    missing = [name for name, obj in names.items() if not (obj.__doc__ or "").strip()]
    assert not missing, missing
