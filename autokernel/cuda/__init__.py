"""CUDA C++ kernel files: the build helper they import (cuda_build.py, the one autokernel import the static check
allows a kernel file) and the device helpers every source starts with (cuda_prelude.py)."""
