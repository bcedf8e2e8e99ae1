"""Rows answered and prompts written by the target through OpenAI-compatible servers: `envkit data regenerate`
(regenerate.py: the entry; row_requests.py: a row to its requests and back; retry.py: --retry-failed's merge) and
`envkit data synthesize` (synthesize.py), both run by one engine (job.py: workers per server, one writer in input
order) over one client (openai_api.py on bounded_http.py) into one ledger (ledger.py: OUT, its errors file and the
checkpointed manifest). May import: support, errors; nothing else of envkit."""
