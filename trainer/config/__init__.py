"""The run's configuration: typed fields with their bounds, the presets, and how flags, a file and a preset resolve."""
