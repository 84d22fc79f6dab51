"""The night's kernels back in the model: verify.py's work as a library call (verification.py), the end-to-end
check, prune and timing behind it (endtoend.py), `autokernel.optimize` (deploy.py) and the self-contained
package of `verify.py --export` (export.py)."""
