"""Machinery the benchmarks and tools share (not shipped with the plugin)."""
