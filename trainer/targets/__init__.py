"""Targets that have learned something: recipes trained on the stdlib corpus, built once and checked."""
