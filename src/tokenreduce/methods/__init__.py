"""One file per method; importing this package registers them all (and the composite that runs
'A + B' specs, core/compose.py: loaded with the methods so that importing core stays light)."""

from ..core import compose  # noqa: F401
from . import bspf, chunked, cropr, ctp, diffrate, dynamicvit, evit, imagepiece, llf, oracle, pitome, random, tome, topk  # noqa: F401
