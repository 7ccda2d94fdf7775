"""Every public name has a docstring: each class and function a module exports in its
``__all__``, and each public method of those classes (the API reference is generated from
them, ``./dev.sh docs``); those with a tensor or array in their signature name its dtype and
shape."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

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


#: A dtype named: int32, float32, bool, bf16, "host ints", "int array" or "int ``(k,)``"
#: (any integer dtype), "any dtype", "its shape and dtype" ...
DTYPE = re.compile(r"\b(u?int(8|16|32|64)|float(16|32|64)|bool|bf16|bfloat16|fp8|e4m3|ints"
                   r"|int\s+(array|tensor)s?|int(?=\s+``\()|(any|its|same)\s+(shape\s+and\s+)?dtype"
                   r"|dtype\s+and\s+shape|shape\s+and\s+dtype)\b")
#: A shape named in code: ``(num_reqs + 1,)``, ``(rows, width)``; or "any shape", "its
#: shape", "dtype and shape" ...
SHAPE = re.compile(r"``\([^`]*\)``|\b((any|its|same)\s+(dtype\s+and\s+)?shape"
                   r"|dtype\s+and\s+shape|shape\s+and\s+dtype)\b")
ARRAY = re.compile(r"\bTensor\b|\bndarray\b")


def test_public_names_taking_or_returning_arrays_give_shapes_and_dtypes():
    """A public function or method with a tensor or numpy array in its signature says, in
    its docstring, which dtype and shape (or that any will do)."""
    vague, checked = [], 0
    for name, obj in _public_objects():
        if not inspect.isfunction(obj):
            continue
        sig = inspect.signature(obj)
        annotations = [str(p.annotation) for p in sig.parameters.values()]
        if not ARRAY.search(" ".join(annotations + [str(sig.return_annotation)])):
            continue
        checked += 1
        doc = inspect.getdoc(obj) or ""
        if not (DTYPE.search(doc) and SHAPE.search(doc)):
            vague.append(name)
    assert checked > 50  # the signatures were read
    assert not vague, vague
