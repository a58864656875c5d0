"""Ollama's REST API (/api/*) beside the OpenAI and Anthropic surfaces."""
