"""The engine and the OpenAI chat/completions surface."""
