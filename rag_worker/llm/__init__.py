"""LLM backends (Ollama, embedded local model) behind one interface, and the router that picks one per turn."""

from .base import CancelToken, LLMBackend, Resolved, ThinkFilter, strip_think
from .local import LocalBackend
from .ollama_backend import OllamaBackend
from .router import LLMRouter

__all__ = [
    "CancelToken",
    "LLMBackend",
    "LLMRouter",
    "LocalBackend",
    "OllamaBackend",
    "Resolved",
    "ThinkFilter",
    "strip_think",
]
