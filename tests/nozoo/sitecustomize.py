"""Hide the ``[zoo]`` extra (torchvision, scikit-learn) from every Python process started
with this folder on PYTHONPATH, as if they were not installed: the user whose environment
has a torch but no torchvision. Used by tests/test_without_zoo.py.

Each import finder is wrapped so that it finds nothing under a hidden name: ``import
torchvision`` fails with the usual ModuleNotFoundError and ``importlib.util.find_spec``
returns None, exactly as where the package is absent (torch itself probes with find_spec).
"""

import importlib.abc
import sys

HIDDEN = ("torchvision", "sklearn")


class _HidingFinder(importlib.abc.MetaPathFinder):
    def __init__(self, inner):  # noqa: ANN001 - any finder
        self._inner = inner

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - finder protocol
        if fullname.split(".")[0] in HIDDEN:
            return None
        find = getattr(self._inner, "find_spec", None)
        return find(fullname, path, target) if find is not None else None

    def invalidate_caches(self):
        invalidate = getattr(self._inner, "invalidate_caches", None)
        if invalidate is not None:
            invalidate()

    def __getattr__(self, name):  # invalidate_caches, find_distributions, ...
        return getattr(self._inner, name)


sys.meta_path[:] = [_HidingFinder(finder) for finder in sys.meta_path]
for _name in list(sys.modules):
    if _name.split(".")[0] in HIDDEN:  # a .pth file imported one already: forget it
        del sys.modules[_name]
