"""The night's kernels back in the model: the end-to-end check behind verify.py (endtoend.py),
`autokernel.optimize` (deploy.py) and the self-contained package of `verify.py --export` (export.py)."""
