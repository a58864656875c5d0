"""App: LoRA adapters as operator objects (the Adapter model, its admin, vLLM's load/unload routes, startup loading)."""
