"""The networks: the DFlash drafter, its mask and loss, the frozen target (compiled by region, FP8 linears)."""
