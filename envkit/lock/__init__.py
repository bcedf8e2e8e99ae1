"""Lock profiles and what makes them: the profile format, PEP 751 pylock files, `envkit lock` (uv pip compile), `lock --from-venv`, wheelhouses and the uv binary."""
