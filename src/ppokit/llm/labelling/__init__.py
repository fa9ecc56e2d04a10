"""From a scored rollout to the frozen labels of one update: rewards, advantages and value
targets, the sampler-trainer mismatch and its corrections, and the iteration's batch
(dynamic sampling).
"""
