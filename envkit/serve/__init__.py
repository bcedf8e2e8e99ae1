"""Serving: an engine's OpenAI-compatible server from a serve venv (engines), started and stopped as a supervised
run (server). May import: run and every room below it."""
