"""The managed compile cache: its env key and private dir (key), the fingerprint that vouches for it
(fingerprint), warming it (warmup), the caches on this machine (store), what it trusts (trust), and
moving a warm cache between machines (port, megacache). Doctor's check of it is in doctor/cachechecks.py.

Callers import the module they need: doctor reads fingerprints without loading the warm-up's machinery.
"""
