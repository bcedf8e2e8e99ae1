"""Training data: rows read and checked, token stores prepared once and memory-mapped, epochs and buckets, the corpus."""
