"""The one exception SnapMLA raises for inputs it does not support."""


class SnapMLAInputError(ValueError):
    """Raised for inputs SnapMLA does not support; the message names the fix."""
