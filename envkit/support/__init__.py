"""Small helpers every part uses: atomic file operations and private records (fsops, state), reads that follow
no link and never block (safeio), the owner, mode and link rules (trust), terminal-safe text, progress lines, and
the one seam to the trainer's torch-free helpers (trainer_helpers). May import: errors, paths, and `trainer` only
through trainer_helpers."""
