"""tokenreduce: token reduction (pruning and merging) for timm Vision Transformers.

    import timm, tokenreduce
    model = timm.create_model("deit_small_patch16_224")
    tokenreduce.apply(model, "tome(r=13)")
"""

from . import methods  # noqa: F401  (registers the built-in methods)
from .api import Capture, Info, apply, capture, find_info, get_info, is_patched, patched, reapply, reducer_of, remove
from .core.errors import SpecError, TokenReduceError, UnsupportedModelError
from .core.method import (
    Reducer,
    build_reducer,
    get_method,
    list_methods,
    parse_spec,
    register_method,
)

__all__ = [
    "Capture", "Info", "Reducer", "SpecError", "TokenReduceError", "UnsupportedModelError", "apply",
    "build_reducer", "capture", "find_info", "get_info", "get_method", "is_patched", "list_methods",
    "parse_spec", "patched", "reapply", "reducer_of", "register_method", "remove",
]
__version__ = "0.1.0"
