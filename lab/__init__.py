"""Tools and experiments: compare.py (every loss side by side), gpt2.py (GPT-2 weights)."""
