"""Small helpers every part uses: atomic file operations and private records, reads that follow no link and never block, terminal-safe text, progress lines."""
