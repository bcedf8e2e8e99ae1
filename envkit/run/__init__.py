"""A training run: starting it with its preflight (launch), its directory and records (rundir), finding
and following runs (runs), and handing its drafter to serving engines (export)."""
