"""Measurement while training: compile health, FLOPs for MFU, TensorBoard scalars."""
