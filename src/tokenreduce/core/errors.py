"""The one exception family users see for bad input."""


class TokenReduceError(ValueError):
    """Bad spec, unsupported model or invalid input; the message names the problem and the choices."""


class SpecError(TokenReduceError):
    """A method spec that does not parse or names invalid parameters."""


class UnsupportedModelError(TokenReduceError):
    """A model tokenreduce cannot patch (not a timm VisionTransformer, unknown block type...)."""


class DiskFullError(TokenReduceError):
    """A write that found no space (or no quota) left; the writer (models.checkpoint.atomic_write) replaced nothing
    and left no temporary file."""
