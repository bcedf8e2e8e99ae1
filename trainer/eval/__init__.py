"""What a drafter is worth: teacher-forced acceptance and the greedy speculative decoding walk, and the Evaluator
that asks both of a run's Setup (the loop owns one). May import: train's setup and steps, model, data, metrics,
config, common."""
