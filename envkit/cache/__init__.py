"""The managed compile cache: its env key and private dir (key), the fingerprint that vouches for it
(fingerprint), warming it (warmup), the caches on this machine (store), and moving a warm cache between
machines (port, megacache); the trust rules it applies are support/trust.py. May import: trainerproc, venv, lock,
support, errors, paths. Doctor's check of it is in doctor/cachechecks.py.

Callers import the module they need: doctor reads fingerprints without loading the warm-up's machinery.
"""
