"""Lock profiles and what makes them: the profile format, PEP 751 pylock files, `envkit lock` (uv pip compile), wheelhouses and the uv binary (`lock --from-venv` reads a venv as doctor does: doctor/adopt.py). May import:
support, errors, paths."""
