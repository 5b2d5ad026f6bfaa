"""Whether vLLM's own suffix decoding (speculative method `suffix`) can start here.

vLLM imports the suffix trees from the `arctic-inference` package, a C++ extension that PyPI
ships as source only; scripts/setup.sh builds it. Kept apart from app/main_model/baselines.py so
the config check and the bench can ask without importing an engine.
"""

from __future__ import annotations

import importlib.util

# What vLLM's SuffixDecodingProposer imports (vllm/v1/spec_decode/suffix_decoding.py).
SUFFIX_MODULE = "arctic_inference.suffix_decoding"
SUFFIX_MISSING = (
    "vLLM's suffix decoding needs the arctic-inference package, which is not installed in this "
    "environment: run scripts/setup.sh (it builds arctic-inference==0.3.0 from source)"
)


def suffix_available() -> bool:
    """Whether `arctic_inference.suffix_decoding` is importable."""
    try:
        return importlib.util.find_spec(SUFFIX_MODULE) is not None
    except ModuleNotFoundError:  # the parent package itself is missing
        return False
