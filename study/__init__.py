"""The accuracy study behind docs/ACCURACY.md, not part of the shipped plugin: the quantization configurations
SnapMLA is compared with (`ablations`: the paper's configs A-D, the BF16 cache, rejected P' scale rules), the
report over synthetic MLA layers or a trained checkpoint's activations (`accuracy`, `python -m study.accuracy`), and
the capture of those activations (`activations`)."""
