"""The one error hierarchy; the CLI turns these into `Error: ...` and exit code 1."""


class EnvkitError(Exception):
    """A failure the user can act on; the message says what to do next."""


class ProfileError(EnvkitError):
    """A lock profile is unknown, unreadable or incomplete."""


class UvError(EnvkitError):
    """uv failed; the message carries uv's own explanation."""


class HashMismatchError(UvError):
    """A downloaded artifact does not match the hash in the lock."""


class VenvError(EnvkitError):
    """A venv path is missing, foreign, or not usable."""


class CacheError(EnvkitError):
    """The compile cache is untrusted, corrupted, or for another environment."""


class RunError(EnvkitError):
    """A training run could not be started or found."""


class RegenError(EnvkitError):
    """Regeneration stopped or refused: a bad row, a file changed under it, servers gone; what was settled is kept."""
