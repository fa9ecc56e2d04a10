"""Scoring a trained policy against its reference, comparing presets, benchmarks, plots and the
reward-hacking demo.
"""
