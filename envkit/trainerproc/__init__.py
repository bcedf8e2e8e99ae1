"""The bundled trainer run as a process in a venv: the one way to start it (process), its source digest (source),
the environment a run gets (cacheenv, isolation), and what envkit asks of it: hazard proofs, token stores,
pretrained targets. May import: support, lock, venv, errors, paths."""
