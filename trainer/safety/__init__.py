"""Thread-safety for compiled training: the torch hazard mitigations and their self-tests."""
