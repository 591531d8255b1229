"""Import user code named in a spec (``package.module:function``) with clear errors."""

from __future__ import annotations

from collections.abc import Callable

from schemas.errors import SpecError
from stages.libs import import_module


def import_object(ref: str, *, field: str) -> Callable:
    """Import ``module:attr``; errors name the spec field and the import failure."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise SpecError(
            f"'{ref}' is not of the form package.module:function",
            where=field,
            hint="write e.g. examples.digits.model:build",
        )
    try:
        module = import_module(module_name)  # torchvision's compiled-ops trap tolerated
    except Exception as e:  # user code: any import-time failure is the user's to fix
        raise SpecError(
            f"cannot import module '{module_name}' ({type(e).__name__}: {e})",
            where=field,
            hint="check the module path and that it imports on its own",
        ) from e
    try:
        obj = getattr(module, attr)
    except AttributeError as e:
        raise SpecError(
            f"module '{module_name}' has no '{attr}'",
            where=field,
            hint="check the function name after the ':'",
        ) from e
    if not callable(obj):
        raise SpecError(f"'{ref}' is not callable", where=field, hint="name a function")
    return obj
