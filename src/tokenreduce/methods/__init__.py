"""One file per method; importing this package registers them all (and the composite that runs
'A + B' specs, core/compose.py: loaded with the methods so that importing core stays light)."""

from ..core import compose  # noqa: F401
from . import (  # noqa: F401
    bspf,
    chunked,
    cropr,
    ctp,
    diffrate,
    dynamicvit,
    evit,
    imagepiece,
    llf,
    oracle,
    pitome,
    random,
    saint,
    tome,
    topk,
)
