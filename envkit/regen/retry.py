"""`regenerate --retry-failed`: the rows a finished run set aside, asked again, and merged into OUT in input order.

The rows named in OUT.errors.jsonl are answered by the same engine loop into a scratch ledger beside OUT; then OUT
and its errors file are rewritten in one streaming pass over the prompt file (a row answered now takes its place,
one still failing stays set aside) and, with the manifest of the merged files, committed together (merge.py): a
kill at any instant leaves all three old or all three new once the next run of OUT has looked.
"""

from __future__ import annotations

import os
from pathlib import Path

from envkit.errors import RegenError
from envkit.regen import merge
from envkit.regen.job import Run
from envkit.regen.ledger import Ledger, _own, errors_path, manifest_path
from envkit.support.trainer_helpers import file_sha256, loads_json, read_json_file


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
        merge.recover(out)  # a merge a kill interrupted: finished or undone before anything else
        for stale in out.parent.glob(f".{out.name}.retry-*"):  # a killed retry's scratch files (OUT's lock is ours)
            stale.unlink()
        failed = _failed_lines(out, manifest)
        scratch = out.with_name(f".{out.name}.retry-{os.getpid()}")
        ledger = Ledger(scratch, manifest, resume=False)
        try:
            result = Run(request, servers, prompts, ledger, manifest["model"], only_lines=failed).go()
            ledger.close()  # the scratch files whole on disk before they are merged
            _merge(out, scratch, prompts, failed, ledger.settled.observed, manifest)
        finally:
            ledger.close()
            for path in (scratch, errors_path(scratch), manifest_path(scratch), scratch.with_name(scratch.name + ".lock")):
                path.unlink(missing_ok=True)
        record = read_json_file(manifest_path(out), limit=16 << 20)
        result.out, result.manifest, result.errors = str(out), str(manifest_path(out)), str(errors_path(out))
        result.rows, result.failed = record["rows"], record["failed"]
        return result
    finally:
        os.close(lock)


def _merge(out: Path, scratch: Path, prompts, failed: set[int], observed: dict, manifest: dict) -> None:
    """OUT, its errors file and the manifest again, committed together (merge.py): in input order, each line set
    aside before takes the retry's answer, or its new reason; the manifest adds what this retry observed."""
    still_failed = {}
    with errors_path(scratch).open("rb") as handle:
        for raw in handle:
            still_failed[loads_json(raw)["line"]] = raw
    new_out, new_errors = merge.staged(out), merge.staged(errors_path(out))
    with out.open("rb") as old, scratch.open("rb") as new, new_out.open("wb") as out_handle, \
            new_errors.open("wb") as errors_handle:
        for number, _, _ in prompts.rows_from(0, 0):
            if number not in failed:
                out_handle.write(old.readline())
            elif number in still_failed:
                errors_handle.write(still_failed[number])
            else:
                out_handle.write(new.readline())
        for handle in (out_handle, errors_handle):
            handle.flush()
            os.fsync(handle.fileno())
    record = _merged_manifest(read_json_file(manifest_path(out), limit=16 << 20), new_out, new_errors, observed,
                              manifest, len(failed))
    staged_manifest = merge.staged(manifest_path(out))
    with staged_manifest.open("w") as handle:
        handle.write(merge.dumps(record))
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(staged_manifest, 0o644)
    merge.commit(out, [out, errors_path(out), manifest_path(out)])


def _merged_manifest(before: dict, new_out: Path, new_errors: Path, observed: dict, manifest: dict,
                     retried: int) -> dict:
    """The manifest of the merged files: their counts and digests, and every run that answered (this retry's
    servers, engines, answers, tokens and finish reasons added to the first run's)."""
    rows = sum(1 for _ in new_out.open("rb"))
    errors = sum(1 for _ in new_errors.open("rb"))
    total = dict(before.get("observed") or {})
    for key in ("generated_tokens", "requests", "tokens_unreported"):
        total[key] = total.get(key, 0) + observed.get(key, 0)
    for key in ("finish_reasons", "answered_by", "rejected"):
        counts = dict(total.get(key) or {})
        for name, count in observed.get(key, {}).items():
            counts[name] = counts.get(name, 0) + count
        total[key] = counts
    record = before | {"rows": rows, "failed": errors, "output_sha256": file_sha256(new_out),
                       "errors_sha256": file_sha256(new_errors), "retried": retried, "observed": total,
                       "servers": list(dict.fromkeys([*before.get("servers", []), *manifest["servers"]])),
                       "engines": (before.get("engines") or {}) | manifest["engines"],
                       "retries": [*before.get("retries", []), {"servers": manifest["servers"], "retried": retried,
                                                                "answered_by": observed.get("answered_by", {})}]}
    record["settled"] = dict(before["settled"]) | {
        "rows": rows, "failed": errors, "out_bytes": new_out.stat().st_size, "out_sha256": record["output_sha256"],
        "errors_bytes": new_errors.stat().st_size, "errors_sha256": record["errors_sha256"]}
    return record
