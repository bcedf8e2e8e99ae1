"""The package-name grammar (PEP 508) that every reader of a name shares: locks, pylock.toml, dist-info folders."""

import re

PEP508_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
