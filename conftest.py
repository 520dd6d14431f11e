"""Collection rules for the whole tree (the tests and the doctests under ``kvgeom/``).

The modules that import vLLM (``kvgeom/conformance/vllm_*.py``) are collected for doctests only where
vLLM is installed; elsewhere their import would fail. Their behaviour is tested by
``tests/test_conformance.py`` (marked ``vllm``), which skips with the reason when vLLM is missing.
LMCache's harness likewise needs LMCache (``tests/test_lmcache_conformance.py``, marked ``lmcache``).
"""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("vllm") else ["kvgeom/conformance/vllm_*.py"]
# The same for SGLang (kvgeom/conformance/sglang_*.py; tests/test_sglang_conformance.py, marked ``sglang``).
if not importlib.util.find_spec("sglang"):
    collect_ignore_glob.append("kvgeom/conformance/sglang_*.py")
# LMCache's harness (kvgeom/conformance/lmcache_*.py) imports LMCache and vLLM: collected only where both are.
if not (importlib.util.find_spec("lmcache") and importlib.util.find_spec("vllm")):
    collect_ignore_glob.append("kvgeom/conformance/lmcache_*.py")
