"""One file per method; importing this package registers them all."""

from . import chunked, ctp, dynamicvit, evit, random, tome, topk  # noqa: F401
