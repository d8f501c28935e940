"""Model-agnostic core: token state, tensor primitives, schedules, the method registry.

Nothing in ``core`` imports timm.
"""
