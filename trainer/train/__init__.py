"""The training run: set-up, the step's two halves, replicas, executors, the loop, checkpoints, torchrun."""
