"""The bundled DFlash drafter trainer (`python -m trainer`); only this package imports torch, and envkit imports
only its torch-free modules (trainer.common, the corpus and the row formats of trainer.data, the target records)."""
