"""One file per method; importing this package registers them all."""

from . import ctp, evit, random, tome, topk  # noqa: F401
