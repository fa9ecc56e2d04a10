"""What a language model is trained on: prompt datasets and preference pairs, the built-in and
chat tasks, reward functions and how they are set up.
"""
