"""A venv seen from outside and built from a lock: its interpreter and manifest (managed), its installed
distributions (installed), the lock and role envkit recorded for it (record), and `envkit create` (create).
May import: support, lock, errors, paths."""
