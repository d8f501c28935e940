"""Model-agnostic core: token state, tensor primitives, schedules, the method registry.

Nothing in ``core`` imports timm.
"""

from . import compose  # noqa: F401  (registers the composite that runs 'A + B' specs)
