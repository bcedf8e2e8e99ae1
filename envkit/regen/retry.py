"""`regenerate --retry-failed`: the rows a finished run set aside, asked again, and merged into OUT in input order.

The rows named in OUT.errors.jsonl are answered by the same engine loop into a scratch ledger beside OUT; then OUT
and its errors file are rewritten in one streaming pass over the prompt file (a row answered now takes its place,
one still failing stays set aside), renamed into place, and the manifest is written for the merged files.
"""

from __future__ import annotations

import os
from pathlib import Path

from envkit.errors import RegenError
from envkit.regen.job import Run
from envkit.regen.ledger import Ledger, _own, errors_path, manifest_path
from envkit.support.fsops import write_json_atomic
from envkit.support.trainer_helpers import atomic_write, file_sha256, loads_json, read_json_file


def _failed_lines(out: Path, manifest: dict) -> set[int]:
    try:
        before = read_json_file(manifest_path(out), limit=16 << 20)
    except ValueError:
        before = None
    same = isinstance(before, dict) and all(before.get(key) == manifest[key]
                                            for key in ("format", "prompts_sha256", "model", "settings"))
    if not same or before.get("status") != "complete":
        raise RegenError(f"--retry-failed needs a complete regeneration of these prompts, model and settings in {out} "
                         f"(finish it with --resume first)")
    errors = errors_path(out)
    if not errors.exists() or file_sha256(errors) != before.get("errors_sha256") \
            or file_sha256(out) != before.get("output_sha256"):
        raise RegenError(f"{out} or {errors.name} changed since regenerate wrote them; start over or use another --out")
    lines = set()
    with errors.open("rb") as handle:
        for raw in handle:
            record = loads_json(raw)
            lines.add(record["line"])
    return lines


def retry_failed(request, servers, prompts, manifest: dict):
    out = request.out
    lock = _own(out)
    try:
        failed = _failed_lines(out, manifest)
        scratch = out.with_name(f".{out.name}.retry-{os.getpid()}")
        for path in (scratch, errors_path(scratch), manifest_path(scratch)):
            path.unlink(missing_ok=True)
        ledger = Ledger(scratch, manifest, resume=False)
        try:
            result = Run(request, servers, prompts, ledger, manifest["model"], only_lines=failed).go()
            ledger.close()  # the scratch files whole on disk before they are merged
            _merge(out, scratch, prompts, failed)
        finally:
            ledger.close()
            for path in (scratch, errors_path(scratch), manifest_path(scratch), scratch.with_name(scratch.name + ".lock")):
                path.unlink(missing_ok=True)
        record = read_json_file(manifest_path(out), limit=16 << 20)
        rows = sum(1 for _ in out.open("rb"))
        errors = sum(1 for _ in errors_path(out).open("rb"))
        record |= {"rows": rows, "failed": errors, "output_sha256": file_sha256(out),
                   "errors_sha256": file_sha256(errors_path(out)), "retried": len(failed)}
        record["settled"] |= {"rows": rows, "failed": errors, "out_bytes": out.stat().st_size,
                              "out_sha256": record["output_sha256"], "errors_bytes": errors_path(out).stat().st_size,
                              "errors_sha256": record["errors_sha256"]}
        write_json_atomic(manifest_path(out), record, mode=0o644)
        result.out, result.manifest, result.errors = str(out), str(manifest_path(out)), str(errors_path(out))
        result.rows, result.failed = rows, errors
        return result
    finally:
        os.close(lock)


def _merge(out: Path, scratch: Path, prompts, failed: set[int]) -> None:
    """OUT and its errors file again, in input order: each line set aside before takes the retry's answer, or its
    new reason."""
    still_failed = {}
    with errors_path(scratch).open("rb") as handle:
        for raw in handle:
            still_failed[loads_json(raw)["line"]] = raw

    def write_both(out_handle, errors_handle) -> None:
        with out.open("rb") as old, scratch.open("rb") as new:
            for number, _, _ in prompts.rows_from(0, 0):
                if number not in failed:
                    out_handle.write(old.readline())
                elif number in still_failed:
                    errors_handle.write(still_failed[number])
                else:
                    out_handle.write(new.readline())

    errors_tmp = errors_path(out).with_name(f".{errors_path(out).name}.merge")
    with errors_tmp.open("wb") as errors_handle:
        atomic_write(out, lambda handle: write_both(handle, errors_handle))
        errors_handle.flush()
        os.fsync(errors_handle.fileno())
    os.replace(errors_tmp, errors_path(out))
