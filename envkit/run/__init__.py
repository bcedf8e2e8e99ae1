"""A training run: starting it with its preflight (launch), its directory and records (rundir), finding
and following runs (history), and handing its drafter to serving engines (export). May import: doctor, cache,
trainerproc, venv, lock, support, errors, paths."""
