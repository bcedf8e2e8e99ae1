"""The bundled DFlash drafter trainer (`python -m trainer`); only this package imports torch, and envkit imports only trainer.common."""
