"""The drafter handed to serving engines: the DFlash format and its model card."""
