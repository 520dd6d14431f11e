"""Adapters: build kvgeom configs from serving engines' own objects.

Each adapter reads the engine's objects by attribute access only and never
imports the engine (or torch), so ``import kvgeom.adapters.vllm`` works
without vLLM installed. ``docs/adapters.md`` documents every field mapping.
"""

from kvgeom.adapters.vllm import OffloadKeys, config_from_vllm, geometry_from_vllm

__all__ = ["OffloadKeys", "config_from_vllm", "geometry_from_vllm"]
