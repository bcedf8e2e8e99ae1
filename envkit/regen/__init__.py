"""`envkit data regenerate`: prompt rows answered by the target through OpenAI-compatible servers (client:
the API, rows: a row to a request and back, job: order, concurrency, resume and the manifest)."""
