"""A registry record's kernel field: a callable, or a "module:attr" string imported on first use.

Importing the registry then imports no kernel module (nor the MILP stacks the exact ones use); a
string that cannot be imported fails as a kernel that raises (`registry.Algorithm`).
"""

from __future__ import annotations

import importlib


class KernelField:
    """The field's descriptor: the kernel as given until first read, then the one it names (`_import_kernel`)."""

    _REQUIRED = object()

    def __init__(self, default=_REQUIRED):
        self._default = default

    def __set_name__(self, owner, name: str):
        self._name, self._slot = name, f"_{name}"

    def __get__(self, record, owner=None):
        if record is None:  # the dataclass asks the class for the field's default
            if self._default is self._REQUIRED:
                raise AttributeError(self._name)
            return self._default
        kernel = record.__dict__[self._slot]
        if isinstance(kernel, str):
            kernel = _import_kernel(record.name, self._name, kernel)
            record.__dict__[self._slot] = kernel
        return kernel

    def __set__(self, record, kernel):
        record.__dict__[self._slot] = kernel

    def unresolved(self, record):
        """The field as given: the kernel, None, or its "module:attr" string when not yet imported."""
        return record.__dict__[self._slot]


def _import_kernel(algorithm: str, field: str, named: str):
    """The kernel "module:attr" `named` names; RuntimeError naming the algorithm, its `field` and `named` when it
    cannot be imported: a plugin kernel's module that needs a dependency not installed fails as a kernel that
    raises does (the command names the plugin in one line), its SystemExit at import too (as an entry point's)."""
    module, _, attr = named.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except KeyboardInterrupt:
        raise
    except BaseException as error:
        raise RuntimeError(f"algorithm {algorithm!r} could not import its `{field}` {named!r}: "
                           f"{type(error).__name__}: {error}") from error
