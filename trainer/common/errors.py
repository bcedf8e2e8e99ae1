"""The trainer's one input error: `python -m trainer` prints its message as one line and exits 1.

Anything else a command raises is a bug or a failure of torch and keeps its traceback.
"""


class TrainerInputError(ValueError):
    """Bad input to the trainer (a config value, a path, data, a tokenizer, a checkpoint); the message says
    what is wrong and what to do."""


class NonFiniteLoss(TrainerInputError):
    """The loss became NaN or infinite: the run stops as failed, naming the step (a learning rate, gamma or
    data problem; nothing after it would be worth keeping)."""
