"""The token trainer and its configuration, presets, run files, guards, data parallelism and
FSDP, progress, and the other trainers (SFT, reward model, DPO).
"""
