"""The managed compile cache: location, env key, warm-up, fingerprint and verification."""

from __future__ import annotations

from envkit import paths
from envkit.doctor.findings import Finding, Status
from envkit.venv import Venv


def doctor_findings(venv: Venv) -> list[Finding]:
    """cache.fingerprint for doctor."""
    return [Finding("cache.fingerprint", Status.WARN, str(paths.cache_root() / "compile"),
                    "no fingerprinted compile cache exists for this venv: the first steps will compile cold",
                    f"envkit warm-cache --venv {venv.path}")]
