"""sglang-snapmla: SnapMLA FP8 MLA decoding as an SGLang attention-backend plugin.

Modules: numerics (the spec), accuracy (report CLI); see docs/DESIGN.md for the module map.
"""

__version__ = "0.1.0"
