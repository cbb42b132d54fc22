"""TRITON_INTERPRET=1 on a machine without CUDA, set before this directory's test modules import the engine.

Triton decides interpret-or-compile for its own library (`triton.language`) when that is first
imported, and tests/kernels/ (collected after this directory) runs the kernels under the
interpreter on CPU; its conftest sets the variable too late once an engine import here has loaded
Triton. The test run then sees the same environment as before: tests/kernels/conftest.py sets
the variable for the whole session anyway.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
