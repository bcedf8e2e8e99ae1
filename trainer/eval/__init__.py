"""What a drafter is worth: teacher-forced acceptance and the greedy speculative decoding walk."""
