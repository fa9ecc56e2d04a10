"""The models and their sampling: loading and saving Hugging Face directories, fetching known
checkpoints, the built-in tiny model, the fused forward, number formats, positions, batched
generation and the log-prob passes.
"""
