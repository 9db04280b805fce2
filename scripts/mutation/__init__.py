"""scripts/mutate's parts: a scratch copy of the repository and its build (scratch.py), and
the generated campaign (generated.py). scripts/mutate is the one entry point."""
