"""torch-free pieces envkit imports too: errors, atomic files and records, child processes, the metrics rows, the mitigations table, the torch build read without torch."""
