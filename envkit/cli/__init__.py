"""The command line: one module per command group; each parses, calls one library function and renders. It may
import every room; none imports it.

Importing this package registers every command on `main` (the `envkit` entry point). Each command imports the
library code it calls inside its function, so `envkit --help` and a plain doctor load only what they run."""

from envkit.cli import cache, data, doctor, evaluate, runs, serve, target, venvs  # noqa: F401  (each registers its commands)
from envkit.cli.app import main

__all__ = ["main"]
