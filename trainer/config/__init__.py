"""The run's configuration: typed fields with their bounds, the presets, and how flags, a file and a preset resolve."""

# Every preset in one line each, for the help of every command that takes --preset (envkit's and the trainer's);
# importable without the schema, so `envkit --help` stays fast. trainer/config/schema.py holds the presets.
PRESET_SUMMARIES = {
    "tiny": "a random target on CPU, two minutes (the default)",
    "code": "a target trained here on the standard library (code_tiny)",
    "chat": "SmolLM2-135M-Instruct, fetched once (envkit target fetch chat)",
    "qwen3_8b": "Qwen3-8B's shapes with random weights, a GPU workload",
}


def presets_help() -> str:
    return "; ".join(f"{name}: {summary}" for name, summary in PRESET_SUMMARIES.items())
