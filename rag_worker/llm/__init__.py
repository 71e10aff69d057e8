"""LLM backends (Ollama, an OpenAI-compatible server, embedded local model) behind one interface, and the router that picks one per turn."""

from .base import CancelToken, LLMBackend, LLMFailed, Resolved, ThinkFilter, strip_think
from .local import LocalBackend
from .ollama_backend import OllamaBackend
from .openai_backend import OpenAIBackend
from .router import LLMRouter

__all__ = [
    "CancelToken",
    "LLMBackend",
    "LLMFailed",
    "LLMRouter",
    "LocalBackend",
    "OllamaBackend",
    "OpenAIBackend",
    "Resolved",
    "ThinkFilter",
    "strip_think",
]
