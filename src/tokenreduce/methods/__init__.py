"""One file per method; importing this package registers them all."""

from . import bspf, chunked, cropr, ctp, dynamicvit, evit, imagepiece, llf, oracle, random, tome, topk  # noqa: F401
