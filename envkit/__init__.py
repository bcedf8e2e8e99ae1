"""envkit: reproducible GPU training environments with a trusted compile cache."""

__version__ = "0.1.0"
