"""Prompt sets: what identifies a prompt (its normalised user turns' digest, which also decides its held-out split),
and several sources mixed into one training file with a held-out file per source (`envkit data mix`). May import:
support, errors."""
