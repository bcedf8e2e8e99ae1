"""Build tiny pure-Python wheels inside tests, so installs are real and need no network."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(dest: Path, name: str, version: str, *, requires: tuple[str, ...] = (),
                files: dict[str, str] | None = None) -> Path:
    """Write `name-version-py3-none-any.whl` with a module of the same name and a valid RECORD."""
    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    contents = dict(files or {f"{module}/__init__.py": f"VERSION = {version!r}\n"})
    contents[f"{dist_info}/METADATA"] = "".join(
        ["Metadata-Version: 2.1\n", f"Name: {name}\n", f"Version: {version}\n"]
        + [f"Requires-Dist: {r}\n" for r in requires])
    contents[f"{dist_info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: envkit-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{path},{_record_hash(text.encode())},{len(text.encode())}" for path, text in contents.items()]
    record.append(f"{dist_info}/RECORD,,")
    contents[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in contents.items():
            # A fixed timestamp makes equal content give an equal wheel hash.
            archive.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), text)
    return wheel
