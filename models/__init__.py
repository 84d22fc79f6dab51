"""Self-contained models for profile.py: GPT-2, LLaMA, BERT and a template for your own.

Each file stands alone (profile.py loads it by path, so it may not import its siblings) and has a
`tiny` preset for CPU tests.
"""
