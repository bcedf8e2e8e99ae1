"""Training data: rows read and checked, token stores prepared once and memory-mapped, epochs and buckets, the corpus."""

# What a user asks a code assistant, one instruction template per kind (corpus.instruction_pool); "function" alone is
# what the walk measures on. Here, not in corpus, so that envkit's CLI names the kinds without importing the corpus.
INSTRUCTION_KINDS = ("function", "method", "class", "tests", "explain")
